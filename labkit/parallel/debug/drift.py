"""Silent drift: data-parallel ranks whose weights part ways without an error, and the cheap check that finds it.

Data parallelism is correct only while every rank holds the same weights. Nothing in torch checks that: a rank
that built its model from another seed, or skipped one optimizer step after a NaN only it saw, or left a
parameter out of its update, trains on happily. :func:`param_fingerprint` reduces a model's weights to one
integer (exact: it hashes the float bits), :func:`fingerprints` gathers it from every rank (one 8-byte
all-gather), and :func:`first_divergence` names the first checked step and the ranks that disagree with the
majority. Checking every k steps costs one tiny collective per k steps; a step found is exact to within k.

Cases (``DRIFT_CASES``): ``per_rank_seeds`` (each rank its own data order and dropout masks, the gradients
averaged: no drift, as it should be), ``init_seed`` (weights initialised from a per-rank seed and never
broadcast, which DDP's constructor does), ``nan_skip`` (one rank skips its optimizer step after a local NaN),
``unused_param`` (a head one rank did not use this step: its gradient is None there, so that rank's optimizer
skips it while the others apply weight decay to it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from labkit.comm.launch import launch
from labkit.core.clock import now_s
from labkit.core.validation import checked_int

DRIFT_CASES = ("per_rank_seeds", "init_seed", "nan_skip", "unused_param")
_MOD = 2_147_483_647          # 2**31 - 1: keeps every product, and the sum of a billion of them, inside int64


def param_fingerprint(model: nn.Module) -> int:
    """One integer from the exact bits of every parameter: equal weights give equal fingerprints, and a change
    of one bit anywhere changes it (each float's bits times a position weight, summed mod 2**31 - 1)."""
    flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])
    bits = flat.view(torch.int32).to(torch.int64) % _MOD
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.int64) % _MOD
    return int(((bits * weights) % _MOD).sum())


def fingerprints(model: nn.Module) -> list[int]:
    """Every rank's :func:`param_fingerprint`, gathered (call it on every rank at the same step)."""
    mine = torch.tensor([param_fingerprint(model)], dtype=torch.int64)
    every = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(t) for t in every]


def first_divergence(checks: list[tuple[int, list[int]]]) -> tuple[int, tuple[int, ...]] | None:
    """(step, ranks) of the first check where the fingerprints differ, the ranks being those outside the largest
    group of equal fingerprints (rank 0's group on a tie); None if every check agreed."""
    for step, prints in checks:
        if len(set(prints)) > 1:
            groups = sorted(set(prints), key=lambda h: (-prints.count(h), prints.index(h)))
            return step, tuple(r for r, h in enumerate(prints) if h != groups[0])
    return None


class _Net(nn.Module):
    """A small MLP with dropout and an auxiliary head used only on some steps (the unused-parameter case)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
        self.aux = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        out = self.body(x)
        return out + self.aux(x) if use_aux else out


def drift_worker(cases: tuple[str, ...], steps: int, check_every: int, bad_step: int, culprit: int) -> dict:
    """One rank: every case in turn (none of them hangs, so one process group serves them all); case -> checks."""
    return {case: _train(case, steps, check_every, bad_step, culprit) for case in cases}


def _train(case: str, steps: int, check_every: int, bad_step: int, culprit: int, seed: int = 0) -> list:
    """Hand-written synchronous SGD (as notebook 07) with ``case``'s bug, fingerprinted every k steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank if case == "init_seed" else seed)       # the bug: a per-rank init seed
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=0.01)
    torch.manual_seed(seed + 100 + rank)          # data order and dropout masks: rightly different per rank
    checks = []
    for step in range(steps):
        if step % check_every == 0:
            checks.append((step, fingerprints(model)))
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        if case == "nan_skip" and rank == culprit and step == bad_step:
            x[0, 0] = float("nan")                                      # one corrupt sample, on one rank
        use_aux = not (case == "unused_param" and rank == culprit and step >= bad_step)
        loss = nn.functional.mse_loss(model(x, use_aux), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():             # average the gradients; an unused one counts as zero here ...
            g = torch.nan_to_num(p.grad, nan=0.0) if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g)
            if p.grad is not None:               # ... but is not handed to the optimizer, which then skips it
                p.grad.copy_(g / world)
        if torch.isfinite(loss) or case != "nan_skip":
            opt.step()                           # the NaN rank skips its step: the others do not
    checks.append((steps, fingerprints(model)))
    return checks


@dataclass(frozen=True)
class DriftEvidence:
    """One drift case: every check's fingerprints, where they first differ, and what was injected where."""

    case: str
    checks: list
    found: tuple[int, tuple[int, ...]] | None     # (first differing checked step, the odd ranks) or None
    bad_step: int
    culprit: int
    check_every: int
    wall_s: float

    def window(self) -> tuple[int, int] | None:
        """(last agreeing checked step, first differing one): the bug happened at a step in between."""
        if self.found is None:
            return None
        steps = [s for s, _ in self.checks]
        i = steps.index(self.found[0])
        return (steps[i - 1] if i else -1, self.found[0])


def run_drift(cases: tuple[str, ...] = DRIFT_CASES, *, world_size: int = 3, steps: int = 12, check_every: int = 2,
              bad_step: int = 5, culprit: int | None = None, timeout_s: float = 120.0) -> dict[str, DriftEvidence]:
    """Run the drift cases on ``world_size`` real gloo ranks (one launch) and find each one's step and rank."""
    unknown = [c for c in cases if c not in DRIFT_CASES]
    if unknown or not cases:
        raise ValueError(f"cases must be some of {DRIFT_CASES}, got {cases!r}")
    checked_int(world_size, "world_size", minimum=2, hint="drift needs two ranks to part")
    checked_int(check_every, "check_every")
    checked_int(steps, "steps", minimum=2)
    checked_int(bad_step, "bad_step", minimum=0, maximum=steps - 1)
    culprit = world_size - 1 if culprit is None else checked_int(culprit, "culprit", minimum=0,
                                                                  maximum=world_size - 1)
    start = now_s()
    results = launch(drift_worker, world_size, args=(tuple(cases), steps, check_every, bad_step, culprit),
                     backend="gloo", timeout_s=timeout_s, show_output=False)
    wall = now_s() - start
    return {case: DriftEvidence(case, results[0][case], first_divergence(results[0][case]), bad_step, culprit,
                                check_every, wall) for case in cases}
