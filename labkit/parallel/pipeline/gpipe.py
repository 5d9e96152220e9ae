"""Pipeline parallelism: the GPipe schedule simulated and measured on real processes, and its bubble.

Naive splitting leaves every stage but one idle at any moment; GPipe-style pipelining cuts the batch into
m micro-batches so stages overlap, leaving a "bubble" of (p-1)/(m+p-1) of the time idle for p stages
(Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism"; the
formula is ``labkit.parallel.pipeline.schedule_sim.predicted_bubble``). Here the stages run on two GPUs when
there are two, otherwise as two real CPU processes (gloo ``send``/``recv``) whose timestamps measure the bubble;
``simulate_gpipe`` replays the same schedule from per-stage times so prediction and measurement can be compared.
Every action, simulated or measured, is a :class:`labkit.parallel.pipeline.schedule_sim.Span` (stage s runs on rank
s here), the one timeline type the schedules of notebook 05b use too.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.clock import now_s, thread_time_s
from labkit.core.timing import synchronize
from labkit.core.validation import positive_int, positive_ints
from labkit.parallel.data.scaling import timing_noise
from labkit.parallel.pipeline.model_parallel import SplitConfig, build_stages
from labkit.parallel.pipeline.schedule_sim import Span, bubble_of_total, makespan_s, predicted_bubble, replay


# ---------------------------------------------------------------------------- the schedule, simulated
def simulate_gpipe(forward_s: list[float], backward_s: list[float], micro_batches: int) -> list[Span]:
    """Fill-drain GPipe schedule, stage s on rank s: all forwards in order, then all backwards in reverse, each
    action as soon as its stage is free and its input is there (:func:`labkit.parallel.pipeline.schedule_sim.replay`
    of that order with these durations)."""
    p, m = len(forward_s), positive_int(micro_batches, "micro_batches")
    if p < 1 or len(backward_s) != p:
        raise ValueError(f"need one forward and one backward time per stage, got {p} and {len(backward_s)}")
    order = [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]
    return replay([Span(s, s, kind, i, float(n), float(n) + (forward_s[s] if kind == "F" else backward_s[s]))
                   for s in range(p) for n, (kind, i) in enumerate(order)])


# ---------------------------------------------------------------------------- the schedule, for real
def _now(device: torch.device) -> float:
    """The kit's clock once the device's queued work is done. now_s() reads CLOCK_MONOTONIC (Linux), one clock
    for every process on the machine, so the stages' timestamps line up."""
    synchronize(device)
    return now_s()


def _run_pipeline(stage: nn.Module, cfg: SplitConfig, m: int, micro_batch: int, device: torch.device) -> list[Span]:
    """One GPipe step over ``m`` micro-batches on 2+ ranks, rank r = stage r; this rank's actions."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(cfg.seed)
    xs = [torch.randn(micro_batch, cfg.in_features, generator=gen).to(device) for _ in range(m)]
    ys = [torch.randint(0, cfg.num_classes, (micro_batch,), generator=gen).to(device) for _ in range(m)]
    spans, inputs, outputs, pending = [], [], [], []
    for i in range(m):                                             # forwards, in order
        if rank == 0:
            a = xs[i]
        else:
            a = torch.empty(micro_batch, cfg.hidden, device=device)
            dist.recv(a, rank - 1)
            a.requires_grad_(True)
        c0, t0 = thread_time_s(), _now(device)
        out = stage(a)
        if rank == world_size - 1:
            out = nn.functional.cross_entropy(out, ys[i]) / m
        t1 = _now(device)
        spans.append(Span(rank, rank, "F", i, t0, t1, thread_time_s() - c0))
        inputs.append(a); outputs.append(out)
        if rank < world_size - 1:
            pending.append(dist.isend(out.detach(), rank + 1))
    for i in reversed(range(m)):                                   # backwards, in reverse
        grad = None
        if rank < world_size - 1:
            grad = torch.empty_like(outputs[i])
            dist.recv(grad, rank + 1)
        c0, t0 = thread_time_s(), _now(device)
        outputs[i].backward(grad)
        t1 = _now(device)
        spans.append(Span(rank, rank, "B", i, t0, t1, thread_time_s() - c0))
        if rank > 0:
            pending.append(dist.isend(inputs[i].grad, rank - 1))
    for req in pending:
        req.wait()
    return spans


def micro_batch_size(batch: int, micro_batches: int) -> int:
    """Samples per micro-batch when ``batch`` is cut into ``micro_batches`` equal parts (or one clear error)."""
    batch, micro_batches = positive_int(batch, "batch"), positive_int(micro_batches, "micro_batches")
    if batch % micro_batches:
        raise ValueError(f"batch={batch} must split evenly into {micro_batches} micro-batches; pick a batch that "
                         f"is a multiple of every micro-batch count")
    return batch // micro_batches


def pipeline_worker(micro_batch_counts: list[int], batch: int = 64, repeats: int = 3,
                    cfg: SplitConfig | None = None) -> dict[int, list[Span]]:
    """Run inside launch(world_size=stages): per micro-batch count, the least-disturbed repeat's actions."""
    torch.set_num_threads(1)
    cfg = cfg or SplitConfig(stages=dist.get_world_size())
    device = rank_device()
    stage = build_stages(cfg)[dist.get_rank()].to(device)
    best: dict[int, list[Span]] = {}
    for m in micro_batch_counts:
        micro_batch = micro_batch_size(batch, m)
        _run_pipeline(stage, cfg, m, micro_batch, device)           # warm-up
        for _ in range(repeats):
            dist.barrier()
            spans = _run_pipeline(stage, cfg, m, micro_batch, device)
            stage.zero_grad()
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, spans)
            merged = [s for got in gathered for s in got]
            if m not in best or makespan_s(merged) < makespan_s(best[m]):
                best[m] = merged
    return best


def _median_s(spans: list[Span], stage: int, kind: str) -> float:
    return statistics.median(s.duration_s for s in spans if s.stage == stage and s.kind == kind)


def pipeline_timing_noise(spans: list[Span]) -> float:
    """Worst p90/p10 over (stage, kind) of the durations of the same work: ~1.1 quiet, >1.5 busy machine."""
    groups = {(s.stage, s.kind) for s in spans}
    return max(timing_noise([s.duration_s for s in spans if (s.stage, s.kind) == g]) for g in groups)


def pipeline_cpu_share(spans: list[Span]) -> float:
    """CPU time / wall time over the stages' work: ~1 when each stage process had its own core."""
    return sum(s.cpu_s for s in spans) / sum(s.duration_s for s in spans)


@dataclass(frozen=True)
class BubblePoint:
    """Predicted (formula and simulation from measured stage times) vs measured bubble for one m."""

    micro_batches: int
    predicted: float
    simulated: float
    measured: float
    makespan_s: float


def analyse_pipeline(runs: dict[int, list[Span]], stages: int = 2) -> list[BubblePoint]:
    """Turn measured actions into BubblePoints, replaying each run's median stage times through simulate_gpipe."""
    points = []
    for m, spans in sorted(runs.items()):
        sim = simulate_gpipe([_median_s(spans, s, "F") for s in range(stages)],
                             [_median_s(spans, s, "B") for s in range(stages)], m)
        points.append(BubblePoint(m, predicted_bubble(stages, m), bubble_of_total(sim, stages),
                                  bubble_of_total(spans, stages), makespan_s(spans)))
    return points


def launch_pipeline(micro_batch_counts: tuple[int, ...] = (1, 2, 4, 8), *, batch: int = 64, repeats: int = 3,
                    cfg: SplitConfig | None = None, timeout_s: float = 120.0) -> dict[int, list[Span]]:
    """Two real processes (gloo, or NCCL on 2 GPUs), one stage each: the measured actions per micro-batch count."""
    cfg = cfg or SplitConfig()
    counts = positive_ints(micro_batch_counts, "micro_batch_counts")
    for m in counts:
        micro_batch_size(batch, m)                 # every count must divide the batch: say so before launching
    repeats = positive_int(repeats, "repeats")
    return launch(pipeline_worker, cfg.stages, kwargs=dict(micro_batch_counts=list(counts), batch=batch,
                  repeats=repeats, cfg=cfg), timeout_s=timeout_s, show_output=False)[0]


def measure_pipeline(micro_batch_counts: tuple[int, ...] = (1, 2, 4, 8), *, batch: int = 64, repeats: int = 3,
                     cfg: SplitConfig | None = None, timeout_s: float = 120.0) -> list[BubblePoint]:
    """Bubble predicted (formula), simulated (measured stage times) and measured, per micro-batch count."""
    cfg = cfg or SplitConfig()
    runs = launch_pipeline(micro_batch_counts, batch=batch, repeats=repeats, cfg=cfg, timeout_s=timeout_s)
    return analyse_pipeline(runs, cfg.stages)
