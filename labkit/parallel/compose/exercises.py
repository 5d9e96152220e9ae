"""Checked exercises for notebook 18 (every parallelism on one mesh): the ranks in a rank's dp group, the rule a model
shape breaks, and the bytes ring attention sends per layer when it runs inside tensor parallelism.

References: the grid and its rules (:class:`labkit.comm.mesh.Mesh`) and the cp formula
(:func:`labkit.parallel.compose.runs.predicted_bytes`).
"""
from __future__ import annotations

import random

from labkit.comm.mesh import Mesh
from labkit.core.exercises import Exercise, Mistake


# ------------------------------------------------------------------------------------------ 1: a rank's dp group
def dp_group_reference(rank: int, dp: int, pp: int, cp: int, tp: int) -> list[int]:
    """The ranks in ``rank``'s data-parallel group on the grid arange(world).view(dp, pp, cp, tp)."""
    return Mesh(dp=dp, pp=pp, cp=cp, tp=tp).group_of(rank, "dp")


def _dp_group_cases(seed: int = 180) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"rank": 3, "dp": 2, "pp": 1, "cp": 1, "tp": 2}]
    while len(cases) < 8:
        dp, pp, cp, tp = rng.choice([2, 4]), rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([2, 4])
        cases.append({"rank": rng.randrange(dp * pp * cp * tp), "dp": dp, "pp": pp, "cp": cp, "tp": tp})
    return cases


def _consecutive(rank: int, dp: int, pp: int, cp: int, tp: int) -> list[int]:
    start = rank // dp * dp
    return list(range(start, start + dp))


def _stride_tp_only(rank: int, dp: int, pp: int, cp: int, tp: int) -> list[int]:
    first = rank % tp
    return [first + i * tp for i in range(dp)]


DP_GROUP = Exercise(
    "dp_group", "the ranks in a rank's data-parallel group on the grid view(dp, pp, cp, tp)",
    dp_group_reference, _dp_group_cases,
    (Mistake("consecutive", _consecutive, "consecutive ranks share a tp group (tp is the fastest axis): dp is the "
             "slowest, so a dp group's ranks are pp * cp * tp apart"),
     Mistake("stride_tp", _stride_tp_only, "the ranks of a dp group are pp * cp * tp apart, not tp: every pipeline "
             "stage and context shard lies between two data-parallel replicas")),
    "rank = ((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i: keep pp_i, cp_i, tp_i and let dp_i run over 0..dp-1",
    rel_tol=0.0)


# ------------------------------------------------------------------------------------------ 2: which rule breaks
RULES = ("tp", "pp", "seq", "dp", "none")


def broken_rule_reference(heads: int, layers: int, seq_len: int, batch: int, dp: int, pp: int, cp: int,
                          tp: int) -> str:
    """The first rule the shape breaks on the mesh ('tp', 'pp', 'seq', 'dp'), or 'none'."""
    problems = Mesh(dp=dp, pp=pp, cp=cp, tp=tp).model_problems(heads=heads, layers=layers, seq_len=seq_len,
                                                               batch=batch)
    return problems[0].split(":")[0] if problems else "none"


def _broken_rule_cases(seed: int = 181) -> list[dict]:
    """Two fixed cases that tell the two planted mistakes apart on the notebook's grid (dp, pp, cp, tp all 2), then
    two random shapes per answer: a new seed draws shapes not shown before, so a table of shown answers fails."""
    base = {"heads": 8, "layers": 8, "seq_len": 64, "batch": 8, "dp": 2, "pp": 2, "cp": 2, "tp": 2}
    cases = [dict(base), {**base, "seq_len": 12}]        # 'none' on 16 ranks (batch by dp only); tp x cp but not x 2cp
    rng = random.Random(seed)
    for rule in RULES * 2:
        for _ in range(10_000):
            case = {"heads": rng.choice((4, 6, 8, 12, 16)), "layers": rng.choice((4, 6, 8, 12, 16)),
                    "seq_len": rng.choice((12, 16, 24, 32, 36, 48, 64, 96)), "batch": rng.choice((4, 6, 8, 12, 16)),
                    **{axis: rng.choice((1, 2, 3, 4)) for axis in ("dp", "pp", "cp", "tp")}}
            if broken_rule_reference(**case) == rule and case not in cases:
                cases.append(case)
                break
    rng.shuffle(cases)
    return cases


def _zigzag_forgotten(heads: int, layers: int, seq_len: int, batch: int, dp: int, pp: int, cp: int, tp: int) -> str:
    if tp > 1 and heads % tp:
        return "tp"
    if pp > 1 and layers % pp:
        return "pp"
    if seq_len % (tp * cp):
        return "seq"
    return "dp" if batch % dp else "none"


def _batch_per_world(heads: int, layers: int, seq_len: int, batch: int, dp: int, pp: int, cp: int, tp: int) -> str:
    rule = broken_rule_reference(heads, layers, seq_len, batch, dp, pp, cp, tp)
    return "dp" if rule == "none" and batch % (dp * pp * cp * tp) else rule


BROKEN_RULE = Exercise(
    "broken_rule", "which divisibility rule a model shape breaks on a mesh: 'tp', 'pp', 'seq', 'dp' or 'none'",
    broken_rule_reference, _broken_rule_cases,
    (Mistake("zigzag_forgotten", _zigzag_forgotten, "the zig-zag split cuts the sequence into 2 x cp chunks, so the "
             "sequence must divide by tp x 2cp, not tp x cp"),
     Mistake("batch_per_world", _batch_per_world, "only dp splits the batch: pp, cp and tp ranks see the same "
             "sequences, so the batch must divide by dp alone")),
    "tp: heads % tp; pp: layers % pp; seq: seq_len % (tp x 2cp) for the axes > 1; dp: batch % dp",
    rel_tol=0.0)


# ------------------------------------------------------------------------------------------ 3: ring bytes inside tp
def ring_bytes_reference(batch: int, seq_len: int, hidden: int, tp: int, cp: int, bytes_per_element: int) -> int:
    """Bytes one rank sends per layer on the cp axis: its K/V block (2 x b x s/cp x h/tp) 3cp - 2 times (cp - 1
    forward, cp - 1 backward, and the gradient accumulator cp times)."""
    block = 2 * batch * (seq_len // cp) * (hidden // tp) * bytes_per_element
    return (3 * cp - 2) * block


def ring_bytes_cases_for(batch: int, seq_len: int, hidden: int, tp: int, cp: int, bytes_per_element: int = 4) -> list[dict]:
    """This notebook's tp x cp run first (its verdict shows it, next to the bytes measured), then random ones."""
    first = {"batch": batch, "seq_len": seq_len, "hidden": hidden, "tp": tp, "cp": cp,
             "bytes_per_element": bytes_per_element}
    return [first] + _ring_bytes_cases()


def _ring_bytes_cases(seed: int = 182) -> list[dict]:
    rng = random.Random(seed)
    return [{"batch": rng.randint(1, 8), "seq_len": rng.choice([1024, 4096]), "hidden": rng.choice([1024, 4096]),
             "tp": rng.choice([2, 4, 8]), "cp": rng.choice([2, 4]), "bytes_per_element": rng.choice([2, 4])}
            for _ in range(8)]


RING_BYTES = Exercise(
    "ring_bytes_per_layer", "bytes one rank sends per layer on the cp axis, ring attention inside tensor parallelism",
    ring_bytes_reference, _ring_bytes_cases,
    (Mistake("forward_only", lambda batch, seq_len, hidden, tp, cp, bytes_per_element:
             (cp - 1) * 2 * batch * (seq_len // cp) * (hidden // tp) * bytes_per_element,
             "backward passes the K/V blocks round again (cp - 1) and sends each block's gradient behind it (cp)"),
     Mistake("every_head", lambda batch, seq_len, hidden, tp, cp, bytes_per_element:
             (3 * cp - 2) * 2 * batch * (seq_len // cp) * hidden * bytes_per_element,
             "under tp each rank holds h/tp of the width (its heads): its K/V block is 1/tp of the layer's")),
    "one K/V block is 2 x b x s/cp x h/tp elements; count its passes forward and backward, and the gradient's",
    rel_tol=0.0)
