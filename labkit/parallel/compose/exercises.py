"""Checked exercises for notebook 18 (every parallelism on one mesh): the ranks in a rank's dp group, the rule a model
shape breaks, the bytes ring attention sends per layer when it runs inside tensor parallelism; and "write the
distributed code": the learner's ``mesh_groups(dp, tp)``, judged on 4 live gloo ranks (:mod:`labkit.comm.rank_answers`).

References: the grid and its rules (:class:`labkit.comm.mesh.Mesh`) and the cp formula
(:func:`labkit.parallel.compose.runs.predicted_bytes`). For ``mesh_groups`` each rank builds the answer's groups
(``dist.new_group``, through :func:`labkit.comm.mesh.new_groups`) and all-reduces its rank id, one-hot, in its tp and
its dp group: the sum marks the group's members. The kit's expected groups are those torch's
``init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))`` builds.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from labkit.comm.mesh import Mesh, new_groups
from labkit.comm.rank_answers import RankExercise
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


# ------------------------------------------------------------------------------------------ 4: the groups, live
def mesh_groups(dp: int, tp: int) -> tuple[list[list[int]], list[list[int]]]:
    """The tp groups and the dp groups of a dp x tp grid, tp fastest: rank = dp_i * tp + tp_i."""
    tp_groups = [[d * tp + t for t in range(tp)] for d in range(dp)]      # a row of the grid: consecutive ranks
    dp_groups = [[d * tp + t for d in range(dp)] for t in range(tp)]      # a column: ranks tp apart
    return tp_groups, dp_groups


def device_mesh_groups(dp: int, tp: int) -> tuple[list[list[int]], list[list[int]]]:
    """The kit's expected answer, in a rank: the groups of torch's named DeviceMesh, every rank's gathered."""
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    out = []
    for dim in ("tp", "dp"):
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, dist.get_process_group_ranks(mesh.get_group(dim)))
        out.append(sorted({tuple(sorted(g)): list(sorted(g)) for g in every}.values()))
    return out[0], out[1]


def _dp_fastest(dp: int, tp: int) -> tuple[list[list[int]], list[list[int]]]:
    """Mistake: the transposed grid, dp fastest (rank = tp_i * dp + dp_i)."""
    return [[t * dp + d for t in range(tp)] for d in range(dp)], [[t * dp + d for d in range(dp)] for t in range(tp)]


def _one_group(dp: int, tp: int) -> tuple[list[list[int]], list[list[int]]]:
    """Mistake: every rank in one group, for both axes."""
    return [list(range(dp * tp))], [list(range(dp * tp))]


def _partition(groups: object, axis: str, world: int) -> list[list[int]]:
    """The answer's groups of one axis as lists of ints; ValueError unless they split the ranks 0..world-1."""
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in groups):
        raise TypeError(f"the {axis} groups must be a list of lists of ranks, got {type(groups).__name__}")
    flat = sorted(int(r) for g in groups for r in g)
    if flat != list(range(world)):
        raise ValueError(f"the {axis} groups {[list(g) for g in groups]} must hold each of the {world} ranks once")
    return [[int(r) for r in g] for g in groups]


def mesh_groups_case(answer: Callable[..., Any], dp: int, tp: int) -> dict[str, list[int]]:
    """In a rank: the answer's tp and dp groups built with dist.new_group; per axis, the members an all-reduce of
    this rank's one-hot rank id found in its group."""
    got = answer(dp, tp)
    if not isinstance(got, (list, tuple)) or len(got) != 2:
        raise TypeError(f"mesh_groups returned {type(got).__name__}: return (tp_groups, dp_groups)")
    rank, world, out = dist.get_rank(), dist.get_world_size(), {}
    for axis, groups in zip(("tp", "dp"), got):
        mine = [g for g in new_groups(_partition(groups, axis, world)) if g is not None][0]
        one_hot = torch.zeros(world)
        one_hot[rank] = 1.0
        dist.all_reduce(one_hot, group=mine.group)
        out[axis] = [r for r in range(world) if one_hot[r] > 0]
    return out


def mesh_groups_cases(seed: int = 183) -> list[dict]:
    """Every grid of the 4 ranks: 2 x 2 first (the notebook's; it tells the transposed grid apart), then 4 x 1 and
    1 x 4 in a seeded order (they tell one group for everything apart)."""
    rest = [{"dp": 4, "tp": 1}, {"dp": 1, "tp": 4}]
    random.Random(seed).shuffle(rest)
    return [{"dp": 2, "tp": 2}, *rest]


MESH_GROUPS = RankExercise(
    "mesh_groups", "write mesh_groups(dp, tp) for a dp x tp grid of the ranks, tp fastest (rank = dp_i * tp + tp_i): "
    "return (tp_groups, dp_groups), each a list of lists of global ranks",
    mesh_groups, device_mesh_groups, mesh_groups_case, mesh_groups_cases,
    (Mistake("dp_fastest", _dp_fastest, "that is the transposed grid, the rival 'dp fastest': tp is the fastest "
             "axis, so a tp group is consecutive ranks dp_i * tp + 0 .. tp - 1, and a dp group's ranks are tp apart"),
     Mistake("one_group", _one_group, "every rank landed in one group on both axes, the rival 'one group for "
             "everything': a tp group holds tp ranks (dp such groups), a dp group dp ranks (tp such groups)")),
    "tp groups: [[d * tp + t for t in range(tp)] for d in range(dp)]; dp groups: the same ranks read down the "
    "columns, [[d * tp + t for d in range(dp)] for t in range(tp)]", world_size=4, case_s=5.0, rel_tol=0.0)
