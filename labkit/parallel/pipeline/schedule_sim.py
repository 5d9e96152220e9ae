"""Pipeline schedules as timed actions: the bubble in both normalisations, the published formulas, and a replay.

A schedule is, per rank, an ordered list of actions: forward ``F``, full backward ``B``, or the zero-bubble split
of the backward into input gradient ``I`` and weight gradient ``W`` (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", arXiv 2401.10241). Each action of stage s on micro-batch i waits for its inputs: ``F`` for the
previous stage's ``F``, ``B``/``I`` for the same stage's ``F`` and the next stage's ``B``/``I``, ``W`` for its own
``I``. :func:`replay` re-runs each rank's measured action order with measured durations under these rules, so a
live run's makespan can be predicted from its parts.

The bubble has two normalisations, and published tables mix them: idle time over the *total* (makespan) time,
GPipe's (p-1)/(m+p-1) (Huang et al. 2019, "GPipe", sec. 2.3), or over the *ideal* (busy) time, (p-1)/m
(Narayanan et al. SC21, arXiv 2104.04473, sec. 2.2.1; (p-1)/(v m) with v model chunks per device, sec. 2.2.2).
Zero-bubble ZB-H1 cuts 1F1B's bubble to one third when F, B and W take equal time (Qi et al. 2024, sec. 2.1,
Fig. 3). Torch-free: the exercises and tests run it without a process group.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Sequence

from labkit.core.validation import positive_int

KINDS = ("F", "B", "I", "W")          # forward, full backward, input-gradient backward, weight-gradient backward


@dataclass(frozen=True)
class Span:
    """One action on one rank: ``kind`` of ``stage`` on ``micro_batch``, from start_s to end_s (one clock)."""

    rank: int
    stage: int
    kind: str
    micro_batch: int
    start_s: float
    end_s: float
    cpu_s: float = float("nan")       # CPU time the rank's thread used meanwhile (measured runs only)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def label(self) -> str:
        """'F3', 'B0', ...: how schedule pictures and action lists name it."""
        return f"{self.kind}{self.micro_batch}"


# ---------------------------------------------------------------------------------------- the bubble, measured
def makespan_s(spans: Sequence[Span]) -> float:
    """First start to last end over every rank."""
    return max(s.end_s for s in spans) - min(s.start_s for s in spans)


def bubble_of_total(spans: Sequence[Span], ranks: int) -> float:
    """Idle share of ranks x makespan: 1 - busy / (p * makespan); GPipe's (p-1)/(m+p-1) normalisation."""
    return 1.0 - sum(s.duration_s for s in spans) / (positive_int(ranks, "ranks") * makespan_s(spans))


def bubble_of_ideal(spans: Sequence[Span], ranks: int) -> float:
    """Idle time over busy time: p * makespan / busy - 1; the (p-1)/m normalisation of Narayanan et al. SC21."""
    return positive_int(ranks, "ranks") * makespan_s(spans) / sum(s.duration_s for s in spans) - 1.0


def ideal_to_total(bubble_ideal: float) -> float:
    """Convert idle/busy into idle/(idle+busy): b / (1 + b), e.g. (p-1)/m -> (p-1)/(m+p-1)."""
    return bubble_ideal / (1.0 + bubble_ideal)


# ---------------------------------------------------------------------------------------- the formulas
def predicted_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's idle fraction (p-1)/(m+p-1) of the total time for p equal stages and m micro-batches (Huang et al.
    2019, sec. 2.3): the kit's one copy of the formula (the planner, notebook 05 and the GPipe lab call it)."""
    stages, micro_batches = positive_int(stages, "stages"), positive_int(micro_batches, "micro_batches")
    return (stages - 1) / (micro_batches + stages - 1)


def micro_batches_for_bubble(stages: int, max_bubble: float) -> int:
    """Smallest m with (p-1)/(m+p-1) <= max_bubble: m >= (p-1)(1-b)/b."""
    if not 0 < max_bubble < 1:
        raise ValueError(f"max_bubble must be between 0 and 1 (exclusive), got {max_bubble}")
    m = 1
    while predicted_bubble(stages, m) > max_bubble:
        m += 1
    return m


def formula_bubble_of_ideal(schedule: str, stages_per_rank: int, ranks: int, micro_batches: int) -> float | None:
    """Published idle/busy for equal stages, or None where no formula is traced to its paper here.

    GPipe and 1F1B (p-1)/m; interleaved 1F1B (p-1)/(v m) (Narayanan et al. SC21, sec. 2.2.2); ZB-H1 (zero bubble
    with one stage per rank) a third of 1F1B's (Qi et al. 2024, sec. 2.1), assuming T_F = T_B = T_W.
    """
    p, m, v = positive_int(ranks, "ranks"), positive_int(micro_batches, "micro_batches"), stages_per_rank
    if schedule in ("ScheduleGPipe", "Schedule1F1B"):
        return (p - 1) / m
    if schedule == "ScheduleInterleaved1F1B":
        return (p - 1) / (positive_int(v, "stages_per_rank") * m)
    if schedule == "ScheduleInterleavedZeroBubble" and v == 1:
        return (p - 1) / (3 * m)
    return None


# ---------------------------------------------------------------------------------------- the replay
def _dependencies(span: Span, last_stage: int) -> list[tuple[int, str, int]]:
    """(stage, kinds, micro-batch) this action waits for; kinds is a string of interchangeable kinds."""
    s, i = span.stage, span.micro_batch
    if span.kind == "F":
        return [(s - 1, "F", i)] if s > 0 else []
    if span.kind == "W":
        return [(s, "I", i)]
    return [(s, "F", i)] + ([(s + 1, "BI", i)] if s < last_stage else [])


def _finder(spans: Sequence[Span]) -> dict[tuple[int, str, int], Span]:
    return {(s.stage, s.kind, s.micro_batch): s for s in spans}


def _producer(done: dict, stage: int, kinds: str, mb: int):
    return next((done[(stage, k, mb)] for k in kinds if (stage, k, mb) in done), None)


def _key(span: Span) -> tuple[int, str, int]:
    return span.stage, span.kind, span.micro_batch


def send_carriers(spans: Sequence[Span], posts: Sequence | None) -> dict[tuple[int, str, int], tuple[int, str, int]]:
    """For each action whose output went to another rank: the action on its rank after which the send was posted
    (itself, unless torch deferred the send: DualPipeV posts an overlapped pair's sends after both halves).
    ``posts`` are the live run's sends (``schedule_trace.Post``: rank, stage, what, micro_batch, time_s)."""
    found, carriers = _finder(spans), {}
    for p in posts or []:
        if not p.what.startswith("send"):
            continue
        made = _producer(found, p.stage, "F" if p.what == "send F" else "BI", p.micro_batch)
        before = [s for s in spans if s.rank == p.rank and s.end_s <= p.time_s]
        if made is not None and before:
            carriers[_key(made)] = _key(max(before, key=lambda s: s.end_s))
    return carriers


def _ready_s(dep: Span, rank: int, done: dict, carriers: dict, hop_s: float) -> float | None:
    """When ``dep``'s output can be used on ``rank``: at once on its own rank, else hop_s after its send leaves."""
    if dep.rank == rank:
        return dep.end_s
    carrier = done.get(carriers.get(_key(dep), _key(dep)))
    return None if carrier is None else carrier.end_s + hop_s


def replay(spans: Sequence[Span], hop_s: float = 0.0, gap_s: float = 0.0, posts: Sequence | None = None
           ) -> list[Span]:
    """Each rank's measured actions in their measured order and durations: an action starts once its rank is
    free (plus ``gap_s`` of host work between actions) and its inputs are there (plus ``hop_s`` across ranks,
    counted from the action after which the live run posted the send, when ``posts`` are given)."""
    queues = {r: sorted((s for s in spans if s.rank == r), key=lambda s: s.start_s) for r in {s.rank for s in spans}}
    last_stage, carriers = max(s.stage for s in spans), send_carriers(spans, posts)
    free = {r: None for r in queues}
    done: dict[tuple[int, str, int], Span] = {}
    out: list[Span] = []
    while any(queues.values()):
        progressed = False
        for r, queue in queues.items():
            while queue:
                span = queue[0]
                deps = [_producer(done, *d) for d in _dependencies(span, last_stage)]
                ready = [None if d is None else _ready_s(d, r, done, carriers, hop_s) for d in deps]
                if any(t is None for t in ready):
                    break
                start = max([0.0 if free[r] is None else free[r] + gap_s] + ready)
                new = replace(span, start_s=start, end_s=start + span.duration_s)
                done[_key(new)], free[r] = new, new.end_s
                out.append(new)
                queue.pop(0)
                progressed = True
        if not progressed:
            stuck = {r: q[0].label + f"@stage{q[0].stage}" for r, q in queues.items() if q}
            raise ValueError(f"this action order cannot run: every rank waits on another ({stuck})")
    return out


def measured_gaps(spans: Sequence[Span], posts: Sequence | None = None) -> tuple[float, float]:
    """(hop_s, gap_s) means from a live run: the wait from a send leaving (the producer's end, or the live post
    when ``posts`` are given) to the consumer on another rank starting, and the host time between two actions
    of a rank whose inputs were already there."""
    found, last_stage = _finder(spans), max(s.stage for s in spans)
    sent = {}
    for p in posts or []:
        made = _producer(found, p.stage, "F" if p.what == "send F" else "BI", p.micro_batch) \
            if p.what.startswith("send") else None
        if made is not None:
            sent[_key(made)] = max(p.time_s, made.end_s)
    hops, gaps = [], []
    for r in {s.rank for s in spans}:
        mine = sorted((s for s in spans if s.rank == r), key=lambda s: s.start_s)
        for prev, span in zip([None] + mine, mine):
            deps = [_producer(found, *d) for d in _dependencies(span, last_stage)]
            latest = max((sent.get(_key(d), d.end_s) for d in deps if d is not None and d.rank != r),
                         default=float("-inf"))
            if latest > (float("-inf") if prev is None else prev.end_s):
                hops.append(span.start_s - latest)
            elif prev is not None:
                gaps.append(span.start_s - prev.end_s)
    return (max(0.0, statistics.fmean(hops)) if hops else 0.0, max(0.0, statistics.fmean(gaps)) if gaps else 0.0)


IDEAL_TIMES = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}    # T_F = T_B = T_W, the papers' assumption (B = I + W)


def ideally_timed(spans: Sequence[Span], times: dict[str, float] | None = None) -> list[Span]:
    """The same actions in the same order per rank, each lasting ``times[kind]``, replayed with free messages:
    the schedule's own bubble, which the published formulas describe."""
    times = times or IDEAL_TIMES
    return replay([replace(s, end_s=s.start_s + times[s.kind]) for s in spans])


def cross_rank_hops(rank_of_stage: Sequence[int]) -> int:
    """Stage boundaries that cross ranks: each costs a message per micro-batch forward, and one backward."""
    return sum(a != b for a, b in zip(rank_of_stage, rank_of_stage[1:]))


# ---------------------------------------------------------------------------------------- orders and memory
def gpipe_order(micro_batches: int) -> list[str]:
    """A GPipe stage's actions: every forward, then every backward (Huang et al. 2019)."""
    m = positive_int(micro_batches, "micro_batches")
    return [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)]


def one_f_one_b_order(stages: int, stage: int, micro_batches: int) -> list[str]:
    """A 1F1B stage's actions: p - s forwards to fill the pipe, then a backward and a forward in turn, then the
    remaining backwards (PipeDream-Flush, Narayanan et al. 2021; torch's ``Schedule1F1B``)."""
    p, m = positive_int(stages, "stages"), positive_int(micro_batches, "micro_batches")
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in 0..{p - 1}, got {stage}")
    warmup = min(p - stage, m)
    order, f = [f"F{i}" for i in range(warmup)], warmup
    for b in range(m):
        order.append(f"B{b}")
        if f < m:
            order.append(f"F{f}")
            f += 1
    return order


def peak_in_flight(order: Sequence[str]) -> int:
    """Most micro-batches whose activations a stage holds at once: forwards done minus backwards done, at peak."""
    held = peak = 0
    for action in order:
        held += {"F": 1, "B": -1, "I": -1}.get(action[0], 0)
        peak = max(peak, held)
    return peak
