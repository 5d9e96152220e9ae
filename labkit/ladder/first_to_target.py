"""The headless ladder's verdict by time to the target: every rung's recipe trained from a fresh model until it
reaches the target accuracy, in paired rounds (one seed per round, every timed rung once in each, the order rotated
from round to round so a slow stretch of a shared machine does not land on one rung), and the rung that reaches
the target first named in ``ladder.json`` and ``ladder.md``.

The timing is notebook 10's section 7 (:func:`labkit.ladder.to_target.rung_steps_to_target`: MLPerf's clock, started
before the run touches its data, stopped at the target; the olympic mean of the seeds; at most one seed may miss).
A rung that misses is written as missed, never as a number; a rung not timed says why.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.data import ImageData
from labkit.core.env import Mode, pick
from labkit.core.models import build_model
from labkit.core.validation import checked_int
from labkit.ladder.config import LadderConfig
from labkit.ladder.report import LadderResult, LadderRow
from labkit.ladder.to_target import EVALS_PER_EPOCH, rung_steps_to_target
from labkit.training.time_to_target import TimeToTarget

# Notebook 10 section 7's fast-mode target: on the lab's digits every recipe of the ladder passes 85% within
# 4 epochs in about a second, so the whole phase stays within the fast-mode budget (a 96% target, rung 0's
# accuracy less the tolerance, took 87 s for 7 rungs x 3 seeds on the shared 2-core machine; 85% took 51 s).
FAST_TARGET = 0.85
FAST_SOURCE = ("fixed 85% in fast mode, notebook 10 section 7's target: every rung of the ladder can reach it "
               "within 4 epochs on two cores")


@dataclass(frozen=True)
class TargetPlan:
    """How the ladder times its rungs to the target: the accuracy (None: rung 0's accuracy after the budget less
    the ladder's accuracy tolerance), where that number comes from, the seeds, the epoch cap per run, and whether
    a torch.compile rung is timed (its compile is paid again by every seed's fresh model)."""

    target: float | None = None
    source: str = ""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    max_epochs: int = 20
    time_compile: bool = True

    def __post_init__(self) -> None:
        if self.target is not None and not (isinstance(self.target, (int, float)) and 0 < self.target < 1):
            raise ValueError(f"target must be an accuracy between 0 and 1 (e.g. 0.9), got {self.target!r}")
        if len(self.seeds) < 3 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"give 3 or more distinct seeds (the olympic mean drops two), got {self.seeds!r}")
        checked_int(self.max_epochs, "max_epochs", minimum=1)

    @classmethod
    def for_mode(cls, mode: Mode | None = None, target: float | None = None) -> TargetPlan:
        """Notebook 10's plan: fast mode 85%, 3 seeds, 4 epochs, no compile rung; full mode rung 0's accuracy
        less the tolerance, 5 seeds, 20 epochs, every single-process rung. ``target`` overrides the accuracy."""
        plan = pick(fast=cls(FAST_TARGET, FAST_SOURCE, (0, 1, 2), 4, False), full=cls(), mode=mode)
        return plan if target is None else dataclasses.replace(plan, target=target, source="--target, as given")


def resolve_target(plan: TargetPlan, result: LadderResult, config: LadderConfig) -> tuple[float, str]:
    """(target accuracy, where it comes from) for this ladder's result."""
    if plan.target is not None:
        return float(plan.target), plan.source or "given"
    base = result.rung(0).val_accuracy
    if base is None:
        raise ValueError("rung 0 has no validation accuracy to derive the target from; give TargetPlan(target=...)")
    target = round(base - config.accuracy_tolerance, 2)
    return target, (f"rung 0's validation accuracy after the fixed budget ({base:.1%}) less the ladder's accuracy "
                    f"tolerance ({config.accuracy_tolerance:.0%}): the bar every kept rung already meets")


def untimed_reason(row: LadderRow, plan: TargetPlan) -> str:
    """Why ``row`` is not timed to the target ("" where it is)."""
    if not row.measured:
        return f"not timed: the rung was not measured ({row.status})"
    if (row.world_size or 1) > 1:
        return "not timed: multi-process rung, its ranks do not stop together at the target"
    if (row.recipe or {}).get("compile") and not plan.time_compile:
        return (f"not timed in fast mode: every seed's fresh model compiles again ({row.startup_s or 0:.0f} s "
                "start-up measured above); full mode times it")
    return ""


def timed_rounds(rows: Sequence[LadderRow], seeds: Sequence[int], run: Callable[[LadderRow, int], int | None]
                 ) -> dict[int, list[tuple[float, int | None]]]:
    """Paired rounds: round k uses ``seeds[k]`` and runs every row once, starting k rows further along;
    rung -> [(seconds or inf where missed, steps or None)] in seed order. ``run(row, seed)`` builds, loads, trains."""
    out: dict[int, list[tuple[float, int | None]]] = {r.rung: [] for r in rows}
    for k, seed in enumerate(seeds):
        for row in [*rows[k % max(1, len(rows)):], *rows[:k % max(1, len(rows))]]:
            start = now_s()                                  # before the run touches its data (MLPerf)
            steps = run(row, seed)
            out[row.rung].append((now_s() - start if steps is not None else math.inf, steps))
    return out


def timed_row(row: LadderRow, runs: list[tuple[float, int | None]], seeds: Sequence[int], target: float,
              max_epochs: int) -> LadderRow:
    """``row`` with its time to the target filled in: olympic mean, per-seed seconds and steps, reached or missed."""
    time = TimeToTarget(f"rung {row.rung}", tuple(t for t, _ in runs), tuple(seeds))
    seconds = [t if math.isfinite(t) else None for t, _ in runs]
    steps = [s for _, s in runs]
    if time.reached:
        missed = f"; {time.missed} seed missed, dropped as the slowest" if time.missed else ""
        return dataclasses.replace(row, to_target_status="reached", time_to_target_s=time.olympic_mean_s,
                                   to_target_seconds=seconds, to_target_steps=steps,
                                   to_target_note=f"olympic mean of {len(seeds)} seeds{missed}")
    return dataclasses.replace(row, to_target_status="missed", time_to_target_s=None, to_target_seconds=seconds,
                               to_target_steps=steps,
                               to_target_note=(f"missed: {time.missed} of {len(seeds)} seeds did not reach "
                                               f"{target:.0%} within {max_epochs} epochs, so it cannot be first"))


def first_and_runner_up(rows: Sequence[LadderRow]) -> tuple[LadderRow | None, LadderRow | None]:
    """(the reached rung with the least olympic mean, the next one), either None where there is none."""
    done = sorted((r for r in rows if r.to_target_status == "reached"), key=lambda r: r.time_to_target_s)
    return (done[0] if done else None), (done[1] if len(done) > 1 else None)


def rounds_won(first: LadderRow, other: LadderRow) -> int:
    """Paired rounds (same seed) in which ``first`` reached the target sooner than ``other`` (a miss is inf)."""
    inf = math.inf
    return sum(1 for a, b in zip(first.to_target_seconds, other.to_target_seconds)
               if (inf if a is None else a) < (inf if b is None else b))


def summary(rows: Sequence[LadderRow], target: float, source: str, plan: TargetPlan, cpu_share: float,
            wall_s: float = math.nan) -> dict:
    """The report's to-target block: the target and its source, the first rung, how decisive, the CPU share and
    the phase's wall time."""
    first, second = first_and_runner_up(rows)
    timed = [r for r in rows if r.to_target_status in ("reached", "missed")]
    per_sample = max(timed, key=lambda r: r.samples_per_s) if timed else None
    won = rounds_won(first, second) if first and second else None
    if first is None:
        verdict = f"no timed rung reached {target:.0%} within {plan.max_epochs} epochs"
    else:
        verdict = f"rung {first.rung} ({first.title}) reached {target:.0%} first: {first.time_to_target_s:.2f} s"
        if second is not None:
            verdict += (f"; ahead of rung {second.rung} ({second.time_to_target_s:.2f} s) in {won} of "
                        f"{len(plan.seeds)} paired rounds" + ("" if won == len(plan.seeds) else
                                                             ", so not decisive on this run"))
    return {"target_accuracy": target, "target_source": source, "seeds": list(plan.seeds),
            "max_epochs": plan.max_epochs, "evals_per_epoch": EVALS_PER_EPOCH,
            "first_rung": None if first is None else first.rung,
            "first_rung_title": None if first is None else first.title,
            "first_time_s": None if first is None else first.time_to_target_s,
            "runner_up_rung": None if second is None else second.rung, "rounds_won_over_runner_up": won,
            "fastest_per_sample_rung": None if per_sample is None else per_sample.rung,
            "cpu_share": cpu_share, "wall_s": wall_s, "verdict": verdict,
            "timing": ("MLPerf Training's rules: clock started before the run touches its data, stopped at the "
                       "target; olympic mean (fastest and slowest seed dropped); one seed per paired round")}


def with_time_to_target(result: LadderResult, config: LadderConfig, data: ImageData, plan: TargetPlan | None = None,
                        *, model_fn: Callable | None = None, device: str = "cpu") -> LadderResult:
    """The result with every rung's time to the target (or why not) and the first rung to reach it."""
    plan = plan or TargetPlan.for_mode()
    target, source = resolve_target(plan, result, config)
    model_fn = model_fn or functools.partial(build_model, config.model, data.num_classes, tuple(data.image_shape))
    timed = [r for r in result.rows if not untimed_reason(r, plan)]

    def run(row: LadderRow, seed: int) -> int | None:
        return rung_steps_to_target(row, config, data, model_fn, device, target, plan.max_epochs, seed)

    start = now_s()
    with ShareMeter() as meter:
        rounds = timed_rounds(timed, plan.seeds, run)
    wall_s = now_s() - start
    rows = [timed_row(r, rounds[r.rung], plan.seeds, target, plan.max_epochs) if r.rung in rounds
            else dataclasses.replace(r, to_target_status="not timed", to_target_note=untimed_reason(r, plan))
            for r in result.rows]
    return dataclasses.replace(result, rows=rows, to_target=summary(rows, target, source, plan, meter.share, wall_s))
