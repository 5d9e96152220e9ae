"""Ring attention's results read back: errors against full attention, memory against the formula, the overlap judged.

The reference is full causal attention with autograd in float64 (:func:`labkit.parallel.context.ring_attention.full_attention`).
The overlap claim: sending the next K/V block while computing on the held one should save about
min(compute, communication) per pass; the lesson asks for at least half of that, measured as the paired per-round
ratio serial / overlapped (the slowest rank each round), judged with the ranks' CPU shares
(:mod:`labkit.core.verdict`): INCONCLUSIVE with the measured reason when the machine is too busy to tell.
"""
from __future__ import annotations

import statistics

import torch

from labkit.core.clock import paired_median
from labkit.core.verdict import Load, Rival, Verdict, judge_at_least, relative_spread
from labkit.parallel.context.ring_attention import (INPUT_TERMS, PACKING_TERMS, all_gather_peak_bytes, full_attention,
                                                    ring_peak_bytes, zigzag_unshard)
from labkit.parallel.context.ring_runs import RingConfig, reference_inputs

MEMORY_BAND = 0.4          # measured peak within +-40% of the formula: allocator and GEMM workspaces move it


def exactness_errors(results: list[dict], cfg: RingConfig, key: str = "exact") -> dict[str, float]:
    """Largest absolute difference of out, dq, dk, dv (all ranks, unsharded) from full attention + autograd;
    ``key``: "exact" (the overlapped ring) or "exact_serial" (each block waited for before it is used)."""
    q, k, v, d_out = (t.requires_grad_(i < 3) for i, t in enumerate(reference_inputs(cfg, cfg.check_seq)))
    ref = full_attention(q, k, v, cfg.causal)
    grads = torch.autograd.grad(ref, (q, k, v), d_out)
    out = {}
    for name, want in zip(("out", "dq", "dk", "dv"), (ref.detach(), *grads)):
        got = zigzag_unshard([r[key][name] for r in results], cfg.check_seq)
        out[name] = float((got - want).abs().max())
    return out


def memory_rows(results: list[dict], cfg: RingConfig) -> list[dict]:
    """Per rank: measured rise of resident memory during the forward beside the formula's new bytes (inputs left
    out: they existed before), their ratio, and whether it lies in the band. The band's low end leaves out the GEMM's
    packed copy: the BLAS packs or not, or reuses a buffer it kept from an earlier multiply (a CI run read 0.69 of
    the whole formula, one packed block short)."""
    terms = ring_peak_bytes(cfg.batch, cfg.heads, cfg.memory_seq, cfg.head_dim, len(results))
    predicted = sum(v for k, v in terms.items() if k not in INPUT_TERMS)
    unpacked = predicted - sum(terms[k] for k in PACKING_TERMS)
    return [{"rank": r["rank"], "measured_MiB": r["peak_bytes"] / 2**20, "formula_MiB": predicted / 2**20,
             "unpacked_MiB": unpacked / 2**20, "measured/formula": r["peak_bytes"] / predicted,
             "in_band": unpacked / (1 + MEMORY_BAND) <= r["peak_bytes"] <= predicted * (1 + MEMORY_BAND)}
            for r in results if r["peak_bytes"] is not None]


def memory_rival(cfg: RingConfig, world_size: int) -> tuple[str, float, bool]:
    """The all-gather rival's new bytes per rank (MiB), and whether :data:`MEMORY_BAND` rejects it: a band that
    admitted it could not tell the ring's blockwise fold from gathering the whole sequence."""
    rival = sum(all_gather_peak_bytes(cfg.batch, cfg.heads, cfg.memory_seq, cfg.head_dim, world_size).values())
    terms = ring_peak_bytes(cfg.batch, cfg.heads, cfg.memory_seq, cfg.head_dim, world_size)
    predicted = sum(v for k, v in terms.items() if k not in INPUT_TERMS)
    return "all-gather K/V and attend the whole sequence at once", rival / 2**20, rival > predicted * (1 + MEMORY_BAND)


def slowest_per_round(results: list[dict], variant: str) -> list[float]:
    """Each round's time of ``variant`` on the slowest rank (the ring waits for it)."""
    return [max(r["seconds"][variant][i] for r in results) for i in range(len(results[0]["seconds"][variant]))]


def overlap_summary(results: list[dict]) -> dict[str, float]:
    """Median ms of each variant, the paired serial/overlapped ratio, and the ratio perfect overlap would give."""
    med = {v: statistics.median(slowest_per_round(results, v)) for v in results[0]["seconds"]}
    ratio = paired_median(slowest_per_round(results, "serial"), slowest_per_round(results, "overlapped"))
    ideal = med["serial"] / max(med["serial"] - min(med["compute_only"], med["comm_only"]), 1e-12)
    return {**{f"{v}_ms": 1e3 * s for v, s in med.items()}, "serial/overlapped": ratio, "ideal ratio": ideal}


def overlap_verdict(results: list[dict]) -> Verdict:
    """Does overlapping hide at least half of what it could (ratio >= 1 + half the ideal gain)? The rival is 'no
    overlap' (serial / overlapped = 1.0: the transfer waits for the compute); the threshold is always above it."""
    s = overlap_summary(results)
    ratios = [a / b for a, b in zip(slowest_per_round(results, "serial"), slowest_per_round(results, "overlapped"))]
    load = Load.of_ranks(results, spread=relative_spread(ratios))
    return judge_at_least("sending the next K/V block during the block compute hides at least half of the "
                          "hideable time", s["serial/overlapped"], 1.0 + 0.5 * (s["ideal ratio"] - 1.0), load=load,
                          rival=Rival("no overlap (serial / overlapped)", 1.0))
