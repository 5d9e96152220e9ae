"""Pipeline parallelism: the GPipe schedule simulated and measured on real processes, and its bubble.

Naive splitting leaves every stage but one idle at any moment; GPipe-style pipelining cuts the batch into
m micro-batches so stages overlap, leaving a "bubble" of (p-1)/(m+p-1) of the time idle for p stages
(Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism"; the
formula is ``labkit.parallel.data.costmodel.predicted_bubble``). Here the stages run on two GPUs when there are
two, otherwise as two real CPU processes (gloo ``send``/``recv``) whose timestamps measure the bubble;
``simulate_gpipe`` replays the same schedule from per-stage times so prediction and measurement can be compared.
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
from labkit.parallel.data.costmodel import predicted_bubble
from labkit.parallel.pipeline.model_parallel import SplitConfig, build_stages
from labkit.parallel.data.scaling import timing_noise


# ---------------------------------------------------------------------------- the schedule, simulated
@dataclass(frozen=True)
class Event:
    """One unit of work on one stage: phase 'F' or 'B' of a micro-batch, start/end in seconds."""

    stage: int
    micro_batch: int
    phase: str
    start_s: float
    end_s: float
    cpu_s: float = float("nan")   # CPU time the rank's thread used meanwhile (measured runs only)


def simulate_gpipe(forward_s: list[float], backward_s: list[float], micro_batches: int) -> list[Event]:
    """Fill-drain GPipe schedule: all forwards in order, then all backwards in reverse, per stage."""
    p, m = len(forward_s), positive_int(micro_batches, "micro_batches")
    if p < 1 or len(backward_s) != p:
        raise ValueError(f"need one forward and one backward time per stage, got {p} and {len(backward_s)}")
    free = [0.0] * p                                   # when each stage is next free
    f_end = [[0.0] * m for _ in range(p)]
    events = []
    for i in range(m):
        for s in range(p):
            start = max(free[s], f_end[s - 1][i] if s else 0.0)
            f_end[s][i] = free[s] = start + forward_s[s]
            events.append(Event(s, i, "F", start, free[s]))
    b_end = [[0.0] * m for _ in range(p)]
    for i in reversed(range(m)):
        for s in reversed(range(p)):
            start = max(free[s], b_end[s + 1][i] if s < p - 1 else 0.0)
            b_end[s][i] = free[s] = start + backward_s[s]
            events.append(Event(s, i, "B", start, free[s]))
    return events


def bubble_fraction(events: list[Event], stages: int) -> float:
    """Idle share of stages x makespan: 1 - busy / (p * (last end - first start))."""
    makespan = max(e.end_s for e in events) - min(e.start_s for e in events)
    busy = sum(e.end_s - e.start_s for e in events)
    return 1.0 - busy / (stages * makespan)


# ---------------------------------------------------------------------------- the schedule, for real
def _now(device: torch.device) -> float:
    """The kit's clock once the device's queued work is done. now_s() reads CLOCK_MONOTONIC (Linux), one clock
    for every process on the machine, so the stages' timestamps line up."""
    synchronize(device)
    return now_s()


def _run_pipeline(stage: nn.Module, cfg: SplitConfig, m: int, micro_batch: int, device: torch.device) -> list[Event]:
    """One GPipe step over ``m`` micro-batches on 2+ ranks, rank r = stage r; this rank's events."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(cfg.seed)
    xs = [torch.randn(micro_batch, cfg.in_features, generator=gen).to(device) for _ in range(m)]
    ys = [torch.randint(0, cfg.num_classes, (micro_batch,), generator=gen).to(device) for _ in range(m)]
    events, inputs, outputs, pending = [], [], [], []
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
        events.append(Event(rank, i, "F", t0, t1, thread_time_s() - c0))
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
        events.append(Event(rank, i, "B", t0, t1, thread_time_s() - c0))
        if rank > 0:
            pending.append(dist.isend(inputs[i].grad, rank - 1))
    for req in pending:
        req.wait()
    return events


def micro_batch_size(batch: int, micro_batches: int) -> int:
    """Samples per micro-batch when ``batch`` is cut into ``micro_batches`` equal parts (or one clear error)."""
    batch, micro_batches = positive_int(batch, "batch"), positive_int(micro_batches, "micro_batches")
    if batch % micro_batches:
        raise ValueError(f"batch={batch} must split evenly into {micro_batches} micro-batches; pick a batch that "
                         f"is a multiple of every micro-batch count")
    return batch // micro_batches


def pipeline_worker(micro_batch_counts: list[int], batch: int = 64, repeats: int = 3,
                    cfg: SplitConfig | None = None) -> dict[int, list[Event]]:
    """Run inside launch(world_size=stages): per micro-batch count, the least-disturbed repeat's events."""
    torch.set_num_threads(1)
    cfg = cfg or SplitConfig(stages=dist.get_world_size())
    device = rank_device()
    stage = build_stages(cfg)[dist.get_rank()].to(device)
    best: dict[int, list[Event]] = {}
    for m in micro_batch_counts:
        micro_batch = micro_batch_size(batch, m)
        _run_pipeline(stage, cfg, m, micro_batch, device)           # warm-up
        for _ in range(repeats):
            dist.barrier()
            events = _run_pipeline(stage, cfg, m, micro_batch, device)
            stage.zero_grad()
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, events)
            merged = [e for evs in gathered for e in evs]
            if m not in best or _makespan(merged) < _makespan(best[m]):
                best[m] = merged
    return best


def _median_s(events: list[Event], stage: int, phase: str) -> float:
    return statistics.median(e.end_s - e.start_s for e in events if e.stage == stage and e.phase == phase)


def pipeline_timing_noise(events: list[Event]) -> float:
    """Worst p90/p10 over (stage, phase) of the durations of the same work: ~1.1 quiet, >1.5 busy machine."""
    groups = {(e.stage, e.phase) for e in events}
    return max(timing_noise([e.end_s - e.start_s for e in events if (e.stage, e.phase) == g]) for g in groups)


def pipeline_cpu_share(events: list[Event]) -> float:
    """CPU time / wall time over the stages' work: ~1 when each stage process had its own core."""
    return sum(e.cpu_s for e in events) / sum(e.end_s - e.start_s for e in events)


def _makespan(events: list[Event]) -> float:
    return max(e.end_s for e in events) - min(e.start_s for e in events)


@dataclass(frozen=True)
class BubblePoint:
    """Predicted (formula and simulation from measured stage times) vs measured bubble for one m."""

    micro_batches: int
    predicted: float
    simulated: float
    measured: float
    makespan_s: float


def analyse_pipeline(runs: dict[int, list[Event]], stages: int = 2) -> list[BubblePoint]:
    """Turn measured events into BubblePoints, replaying each run's median stage times through simulate_gpipe."""
    points = []
    for m, events in sorted(runs.items()):
        sim = simulate_gpipe([_median_s(events, s, "F") for s in range(stages)],
                             [_median_s(events, s, "B") for s in range(stages)], m)
        points.append(BubblePoint(m, predicted_bubble(stages, m), bubble_fraction(sim, stages),
                                  bubble_fraction(events, stages), _makespan(events)))
    return points


def launch_pipeline(micro_batch_counts: tuple[int, ...] = (1, 2, 4, 8), *, batch: int = 64, repeats: int = 3,
                    cfg: SplitConfig | None = None, timeout_s: float = 120.0) -> dict[int, list[Event]]:
    """Two real processes (gloo, or NCCL on 2 GPUs), one stage each: the measured events per micro-batch count."""
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
