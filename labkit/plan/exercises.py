"""Checked exercises for notebook 14 (which parallelism?): the tensor-parallel size that makes a layer fit, the
model state of ZeRO-3 + TP per rank, and the time TP's all-reduces take inside a node and across nodes; and, judged
on live ranks, ring attention's loop (:mod:`labkit.parallel.context.ring_exercise`, checked as ``ex.RING_ATTENTION``).

References: the planner's pieces (:mod:`labkit.plan.specs`, :mod:`labkit.plan.planner`), ZeRO's formula
(:func:`labkit.sharding.memory.zero_paper_bytes`) and the alpha-beta ring (:func:`labkit.comm.collectives.allreduce_cost`).
"""
from __future__ import annotations

import random

from labkit.comm.collectives import allreduce_cost
from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.context.ring_exercise import RING_ATTENTION  # noqa: F401 - notebook 14 checks it as ex.
from labkit.parallel.tensor.cost import ALL_REDUCES_PER_LAYER
from labkit.sharding.memory import zero_paper_bytes


def pick_tp_reference(state_bytes: int, split_activation_bytes: int, replicated_activation_bytes: int,
                      memory_bytes: int, heads: int, gpus_per_node: int) -> int:
    """The smallest tp (dividing the heads, at most a node's GPUs) with state/tp + split/tp + replicated <= memory;
    0 when none fits. Smallest, because every doubling of tp adds all-reduce traffic (Narayanan et al. 2021)."""
    for tp in range(1, gpus_per_node + 1):
        if heads % tp == 0 and (state_bytes + split_activation_bytes) / tp + replicated_activation_bytes <= memory_bytes:
            return tp
    return 0


def _pick_tp_cases(seed: int = 71) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(10):
        gib = 2**30
        cases.append({"state_bytes": rng.randint(20, 400) * gib, "split_activation_bytes": rng.randint(5, 100) * gib,
                      "replicated_activation_bytes": rng.randint(1, 20) * gib, "memory_bytes": rng.choice([40, 80]) * gib,
                      "heads": rng.choice([24, 32, 48, 64]), "gpus_per_node": 8})
    return cases


def _largest_tp(state_bytes: int, split_activation_bytes: int, replicated_activation_bytes: int,
                memory_bytes: int, heads: int, gpus_per_node: int) -> int:
    fits = [t for t in range(1, gpus_per_node + 1) if heads % t == 0 and (state_bytes + split_activation_bytes) / t
            + replicated_activation_bytes <= memory_bytes]
    return max(fits, default=0)


def _all_split(state_bytes: int, split_activation_bytes: int, replicated_activation_bytes: int,
               memory_bytes: int, heads: int, gpus_per_node: int) -> int:
    total = state_bytes + split_activation_bytes + replicated_activation_bytes
    return next((t for t in range(1, gpus_per_node + 1) if heads % t == 0 and total / t <= memory_bytes), 0)


PICK_TP = Exercise(
    "pick_tp", "the smallest tensor-parallel size that makes a layer fit (0 if none inside a node does)",
    pick_tp_reference, _pick_tp_cases,
    (Mistake("largest", _largest_tp, "take the smallest tp that fits: each larger one splits the work thinner and "
             "adds all-reduce traffic for no memory you need"),
     Mistake("all_split", _all_split, "tensor parallelism leaves some activations whole on every rank (the norms' "
             "inputs, dropout masks: 10sbh in Korthikanti et al. 2022): only state and the split part shrink by tp")),
    "try tp = 1, 2, ... up to the GPUs of one node, keep those dividing the heads, and return the first where "
    "(state + split activations) / tp + replicated activations fits")


def zero3_tp_reference(num_params: int, tp: int, dp: int) -> int:
    """Model-state bytes per rank of mixed-precision Adam under TP x ZeRO-3: (2 + 2 + 12) Psi / (tp dp)."""
    return zero_paper_bytes(num_params // tp, "zero3", dp)


def _zero3_cases(seed: int = 72) -> list[dict]:
    rng = random.Random(seed)
    return [{"num_params": rng.choice([7, 13, 70, 175]) * 10**9 // 8 * 8, "tp": rng.choice([1, 2, 4, 8]),
             "dp": rng.choice([2, 4, 8, 16, 64])} for _ in range(10)]


ZERO3_TP = Exercise(
    "zero3_tp_state_bytes", "model-state bytes per rank (bf16 params and grads, fp32 Adam state) with TP and ZeRO-3",
    zero3_tp_reference, _zero3_cases,
    (Mistake("forgets_tp", lambda num_params, tp, dp: zero_paper_bytes(num_params, "zero3", dp),
             "tensor parallelism splits every weight first: ZeRO-3 then shards each rank's 1/tp over the dp ranks"),
     Mistake("zero1", lambda num_params, tp, dp: zero_paper_bytes(num_params // tp, "zero1", dp),
             "ZeRO-3 shards parameters and gradients too, not only the optimizer state: all 16 bytes are divided")),
    "16 bytes per parameter (2 + 2 + 12, ZeRO Section 3.1), divided by tp and then by dp")


def tp_layer_seconds_reference(batch: int, seq_len: int, hidden: int, tp: int, gpus_per_node: int,
                               intra_bytes_s: float, inter_bytes_s: float) -> float:
    """Seconds of one layer's TP all-reduces (2 forward, 2 backward, b*s*h bf16 values each, ring, alpha = 0) on the
    intra-node link when the tp ranks fit in one node, else on the inter-node link."""
    link = intra_bytes_s if tp <= gpus_per_node else inter_bytes_s
    return ALL_REDUCES_PER_LAYER * allreduce_cost("ring", tp, 2 * batch * seq_len * hidden, 0.0, 1.0 / link)


def _tp_layer_cases(seed: int = 73) -> list[dict]:
    rng = random.Random(seed)
    return [{"batch": rng.choice([1, 2, 4]), "seq_len": rng.choice([2048, 4096]), "hidden": rng.choice([4096, 8192]),
             "tp": rng.choice([4, 8, 16]), "gpus_per_node": 8, "intra_bytes_s": 450e9,
             "inter_bytes_s": rng.choice([25e9, 50e9])} for _ in range(10)]


TP_LAYER_SECONDS = Exercise(
    "tp_layer_seconds", "seconds of one layer's tensor-parallel all-reduces, inside a node or across nodes",
    tp_layer_seconds_reference, _tp_layer_cases,
    (Mistake("always_fast", lambda batch, seq_len, hidden, tp, gpus_per_node, intra_bytes_s, inter_bytes_s:
             tp_layer_seconds_reference(batch, seq_len, hidden, tp, 10**6, intra_bytes_s, inter_bytes_s),
             "a TP group larger than a node runs its ring over the slowest link in it: the inter-node one"),
     Mistake("no_ring_factor", lambda batch, seq_len, hidden, tp, gpus_per_node, intra_bytes_s, inter_bytes_s:
             ALL_REDUCES_PER_LAYER * 2 * batch * seq_len * hidden
             / (intra_bytes_s if tp <= gpus_per_node else inter_bytes_s),
             "a ring all-reduce sends 2(t-1)/t of the buffer per rank, not the buffer once")),
    "4 ring all-reduces of 2*b*s*h bytes: 4 * 2(t-1)/t * bytes / bandwidth of the link the group spans")
