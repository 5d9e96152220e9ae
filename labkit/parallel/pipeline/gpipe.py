"""Pipeline parallelism: the GPipe schedule simulated and measured on real processes, and its bubble.

Naive splitting leaves every stage but one idle at any moment; GPipe-style pipelining cuts the batch into
m micro-batches so stages overlap, leaving a "bubble" of (p-1)/(m+p-1) of the time idle for p stages
(Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism"; the
formula is ``labkit.parallel.pipeline.schedule_sim.predicted_bubble``). Here the stages run on two GPUs when
there are two, otherwise as two real CPU processes (gloo ``send``/``recv``) whose timestamps measure the bubble;
``simulate_gpipe`` replays the same schedule from per-stage times so prediction and measurement can be compared.
Every action, simulated or measured, is a :class:`labkit.parallel.pipeline.schedule_sim.Span` (stage s runs on rank
s here), the one timeline type the schedules of notebook 05b use too. Every micro-batch count runs several repeats,
the counts taking turns; the lesson verdicts (``judge_*``) pair the repeats round by round, take their bands from
this run's spread and message time, and name the rival each rules out ((p-1)/m for the bubble, issue 51).
"""
from __future__ import annotations

import math
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
from labkit.core.verdict import Load, Rival, Verdict, judge_agreement, judge_at_least, judge_at_most, relative_spread
from labkit.parallel.data.scaling import timing_noise
from labkit.parallel.pipeline.model_parallel import SplitConfig, build_stages
from labkit.parallel.pipeline.schedule_sim import (Span, bubble_of_total, makespan_s, measured_gaps, predicted_bubble,
                                                   replay)


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


def _run_pipeline(stage: nn.Module, cfg: SplitConfig, m: int, micro_batch: int, device: torch.device,
                  equal_stages: bool = True) -> list[Span]:
    """One GPipe step over ``m`` micro-batches on 2+ ranks, rank r = stage r; this rank's actions. With
    ``equal_stages`` the first stage also computes its input's gradient, so every stage's backward does the same
    matmuls (the formula's assumption); otherwise its backward is a quarter shorter."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(cfg.seed)
    xs = [torch.randn(micro_batch, cfg.in_features, generator=gen).to(device) for _ in range(m)]
    ys = [torch.randint(0, cfg.num_classes, (micro_batch,), generator=gen).to(device) for _ in range(m)]
    spans, inputs, outputs, pending = [], [], [], []
    for i in range(m):                                             # forwards, in order
        if rank == 0:
            a = xs[i].requires_grad_(equal_stages)
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
                    cfg: SplitConfig | None = None, equal_stages: bool = True) -> dict[int, list[list[Span]]]:
    """Run inside launch(world_size=stages): per micro-batch count, every timed repeat's actions (all ranks),
    the counts interleaved round by round so a burst of other work hits every m alike."""
    torch.set_num_threads(1)
    cfg = cfg or SplitConfig(stages=dist.get_world_size())
    device = rank_device()
    stage = build_stages(cfg)[dist.get_rank()].to(device)
    every: dict[int, list[list[Span]]] = {m: [] for m in micro_batch_counts}
    for m in micro_batch_counts:
        _run_pipeline(stage, cfg, m, micro_batch_size(batch, m), device, equal_stages)           # warm-up
    for _ in range(repeats):
        for m in micro_batch_counts:
            dist.barrier()
            spans = _run_pipeline(stage, cfg, m, micro_batch_size(batch, m), device, equal_stages)
            stage.zero_grad()
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, spans)
            every[m].append([s for got in gathered for s in got])
    return every


def least_disturbed(repeats: list[list[Span]]) -> list[Span]:
    """The repeat with the shortest makespan (other work on the machine only ever stretches a run)."""
    if not repeats:
        raise ValueError("least_disturbed needs at least one repeat")
    return min(repeats, key=makespan_s)


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
                    cfg: SplitConfig | None = None, timeout_s: float = 120.0, equal_stages: bool = True
                    ) -> dict[int, list[list[Span]]]:
    """Two real processes (gloo, or NCCL on 2 GPUs), one stage each: every repeat's actions per micro-batch count."""
    cfg = cfg or SplitConfig()
    counts = positive_ints(micro_batch_counts, "micro_batch_counts")
    for m in counts:
        micro_batch_size(batch, m)                 # every count must divide the batch: say so before launching
    repeats = positive_int(repeats, "repeats")
    return launch(pipeline_worker, cfg.stages, kwargs=dict(micro_batch_counts=list(counts), batch=batch,
                  repeats=repeats, cfg=cfg, equal_stages=equal_stages), timeout_s=timeout_s, show_output=False)[0]


# ---------------------------------------------------------------------------- the lessons, judged on every repeat
def repeat_bubbles(repeats: list[list[Span]], stages: int = 2) -> list[float]:
    """The measured bubble (idle share of the total time) of each repeat."""
    return [bubble_of_total(spans, stages) for spans in repeats]


def repeats_load(repeats: list[list[Span]]) -> Load:
    """Each rank's CPU share while it computed (its worst repeat) and the spread of the repeats' bubbles."""
    shares: dict[str, float] = {}
    for spans in repeats:
        for rank in {s.rank for s in spans}:
            mine = [s for s in spans if s.rank == rank and math.isfinite(s.cpu_s)]
            if not mine:
                continue                                    # simulated spans carry no CPU time
            share = sum(s.cpu_s for s in mine) / max(sum(s.duration_s for s in mine), 1e-12)
            shares[f"rank {rank}"] = min(share, shares.get(f"rank {rank}", 1.0))
    return Load.measured(shares, spread=relative_spread(repeat_bubbles(repeats)))


def message_share(spans: list[Span], stages: int = 2) -> float:
    """The idle share one repeat's measured message hops and host gaps add: replayed with them, less without."""
    hop_s, gap_s = measured_gaps(spans)
    return max(0.0, bubble_of_total(replay(spans, hop_s, gap_s), stages) - bubble_of_total(replay(spans), stages))


def bubble_tolerance(repeats: list[list[Span]], stages: int = 2) -> float:
    """The band of the formula check, measured on this run, relative to the formula: half the repeats' p10-p90
    bubble spread (about 2.5 standard errors of their median for 4-8 repeats), plus the median over the repeats of
    the idle share their own message hops and host gaps add (:func:`message_share`)."""
    m = sum(1 for s in repeats[0] if s.stage == 0 and s.kind == "F")
    messages = statistics.median(message_share(spans, stages) for spans in repeats)
    return relative_spread(repeat_bubbles(repeats, stages)) / 2 + messages / predicted_bubble(stages, m)


def judge_bubble_formula(repeats: list[list[Span]], stages: int = 2) -> Verdict:
    """Does the measured bubble follow GPipe's (p-1)/(m+p-1), rather than its rival (p-1)/m (the same idle time
    over the busy time instead of the total)? Each repeat is a paired round; the band is :func:`bubble_tolerance`."""
    m = sum(1 for s in repeats[0] if s.stage == 0 and s.kind == "F")
    bubbles, formula = repeat_bubbles(repeats, stages), predicted_bubble(stages, m)
    return judge_agreement(f"the measured bubble at m={m} follows (p-1)/(m+p-1), not (p-1)/m", formula,
                           statistics.median(bubbles), tolerance=bubble_tolerance(repeats, stages),
                           load=repeats_load(repeats), unit="", by_round=[(formula, b) for b in bubbles],
                           rival=Rival("(p-1)/m", (stages - 1) / m))


def judge_naive_idles(repeats: list[list[Span]], stages: int = 2) -> Verdict:
    """With one micro-batch the stages run strictly in turn: each idles (p-1)/p of the time, less half the rounds'
    spread (the median's uncertainty, as in :func:`bubble_tolerance`);
    the rival is the hope that two devices are both busy (no idle time)."""
    bubbles = repeat_bubbles(repeats, stages)
    floor = (stages - 1) / stages / (1 + relative_spread(bubbles) / 2)
    return judge_at_least("the naive split (m=1) leaves each stage idle (p-1)/p of the time",
                          statistics.median(bubbles), floor, load=repeats_load(repeats), unit="",
                          by_round=[(b, floor) for b in bubbles], rival=Rival("both stages busy at once", 0.0))


def judge_micro_batches_shrink(naive: list[list[Span]], piped: list[list[Span]], stages: int = 2) -> Verdict:
    """Do micro-batches shrink the bubble by more than the medians' uncertainty (half the rounds' spread)? Rival:
    they do not (the naive bubble).
    Round r of ``naive`` and of ``piped`` ran back to back, so they pair."""
    m = sum(1 for s in piped[0] if s.stage == 0 and s.kind == "F")
    low, high = repeat_bubbles(piped, stages), repeat_bubbles(naive, stages)
    spread = max(relative_spread(low), relative_spread(high)) / 2      # the medians' uncertainty
    ceiling = statistics.median(high) / (1 + spread)
    return judge_at_most(f"m={m} micro-batches shrink the naive split's bubble", statistics.median(low), ceiling,
                         load=repeats_load(naive + piped), unit="",
                         by_round=list(zip(low, [h / (1 + spread) for h in high])),
                         rival=Rival("micro-batches change nothing (the naive bubble)", statistics.median(high)))


def measure_pipeline(micro_batch_counts: tuple[int, ...] = (1, 2, 4, 8), *, batch: int = 64, repeats: int = 3,
                     cfg: SplitConfig | None = None, timeout_s: float = 120.0) -> list[BubblePoint]:
    """Bubble predicted (formula), simulated (measured stage times) and measured, per micro-batch count."""
    cfg = cfg or SplitConfig()
    runs = launch_pipeline(micro_batch_counts, batch=batch, repeats=repeats, cfg=cfg, timeout_s=timeout_s)
    return analyse_pipeline({m: least_disturbed(reps) for m, reps in runs.items()}, cfg.stages)
