"""Oversubscription, measured: the same training step with threads matched to the free cores or not, on a busy core.

With a neighbour spinning on one of two cores, a step split over two intra-op threads waits at every operator
for the thread that the scheduler parked behind the neighbour; if idle threads also spin (OpenMP's
``OMP_WAIT_POLICY=ACTIVE``, and for a while by default), they burn the one free core their partner needs. One
thread per *free* core avoids both. The thread pool and OpenMP's wait policy are fixed when torch loads, so each
wait policy runs in a fresh process (:func:`labkit.core.procs.run_in_fresh_process`), in interleaved rounds while
:func:`labkit.core.contention.spinning_cores` keeps the neighbour busy; each child reports its step times, the CPU
seconds it burned per step and the share of a core it got (:class:`labkit.core.contention.ShareMeter`).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from labkit.core.clock import interleaved, paired_median
from labkit.core.contention import ShareMeter, spinning_cores
from labkit.core.machine import cpu_count
from labkit.core.procs import run_in_fresh_process
from labkit.core.validation import checked_int, positive_int
from labkit.core.verdict import Load, Rival, Verdict, judge_at_least, relative_spread

WAIT_POLICIES = ("PASSIVE", "ACTIVE")
# The thresholds sit above the rival 'no difference' (1.0x): a step a quarter slower and a fifth more CPU per step
# than matched threads, margins a 1.0x setting does not reach when its paired rounds agree (a miss whose rounds
# straddle the bar is INCONCLUSIVE, spread). A busy 2-core run here measured 12.4x slower and 7.1x the CPU.
SLOWER_AT_LEAST = 1.25
MORE_CPU_AT_LEAST = 1.2


def time_steps_with_threads(thread_counts: list[int], wait_policy: str, batch: int = 32, steps: int = 3,
                            warmup: int = 1) -> dict[str, dict]:
    """In a fresh process: set the OpenMP wait policy, then time ResNet-18 SGD steps on 32x32 inputs under each
    thread count in turn -> {count: figures}. The policy is fixed when torch loads, a thread count is not, so one
    process per policy measures all of that policy's settings (matched and sleeping share one: half the start-ups)."""
    if wait_policy not in WAIT_POLICIES:
        raise ValueError(f"wait_policy must be one of {WAIT_POLICIES}, got {wait_policy!r}")
    counts = [positive_int(n, "thread count") for n in thread_counts]
    os.environ.update(OMP_WAIT_POLICY=wait_policy, OMP_NUM_THREADS=str(max(counts)))
    import torch  # lazy: OpenMP reads OMP_WAIT_POLICY once, when torch loads

    from labkit.core.models import resnet18_cifar  # lazy: loads torch
    from labkit.core.timing import time_fn  # lazy: loads torch
    from labkit.training.config import TrainConfig  # lazy: loads torch
    from labkit.training.stepper import Stepper  # lazy: loads torch

    torch.manual_seed(0)
    model = resnet18_cifar(10)
    config = TrainConfig(steps=warmup + steps, progress=False, evaluate=False, profile_model=False)
    stepper = Stepper(model, config.spec.build_optimizer(model), config, torch.device("cpu"))
    data = (torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,)))
    out = {}
    for threads in counts:
        torch.set_num_threads(threads)
        with ShareMeter() as meter:
            timing = time_fn(lambda: stepper.step(1, data), warmup=warmup, repeats=steps, device="cpu")
        cpu_s = meter.result.on_cpu_s if meter.result else 0.0
        out[str(threads)] = {"step_s": timing.median_s, "cpu_s_per_step": cpu_s / (warmup + steps),
                             "cpu_share": meter.share, "threads_seen": torch.get_num_threads()}
    return out


@dataclass(frozen=True)
class OversubscriptionRun:
    """Per setting ('matched', 'oversubscribed', ...) the children's results, round by round."""

    threads: dict[str, int]
    rounds: dict[str, list[dict]]
    busy_cores: int
    cores: int

    def median(self, setting: str, key: str) -> float:
        """Median over rounds of one child figure (``step_s``, ``cpu_s_per_step``, ``cpu_share``)."""
        return statistics.median(r[key] for r in self.rounds[setting])

    def slowdown(self, setting: str, baseline: str = "matched") -> float | None:
        """Paired median over rounds of this setting's step time over the baseline's."""
        return paired_median([r["step_s"] for r in self.rounds[setting]],
                             [r["step_s"] for r in self.rounds[baseline]])

    def table(self) -> list[dict]:
        """One row per setting, units in the names, for a DataFrame."""
        return [{"setting": name, "threads": self.threads[name], "step_ms": 1e3 * self.median(name, "step_s"),
                 "cpu_ms_per_step": 1e3 * self.median(name, "cpu_s_per_step"),
                 "cpu_share": self.median(name, "cpu_share"), "x_matched": self.slowdown(name)}
                for name in self.rounds]


def oversubscription_settings(cores: int, busy_cores: int) -> dict[str, tuple[int, str]]:
    """name -> (threads, wait policy): one thread per free core, then one per core (spinning, then sleeping)."""
    free = cores - busy_cores
    if free < 1:
        raise ValueError(f"{busy_cores} busy core(s) leave none of {cores} free: use busy_cores < cores")
    return {"matched": (free, "PASSIVE"), "oversubscribed, spinning": (cores, "ACTIVE"),
            "oversubscribed, sleeping": (cores, "PASSIVE")}


def measure_oversubscription(busy_cores: int = 1, *, rounds: int = 2, batch: int = 32, steps: int = 3,
                             timeout_s: float = 300.0) -> OversubscriptionRun:
    """Keep ``busy_cores`` cores spinning and time each setting's step in fresh processes, interleaved."""
    busy_cores = checked_int(busy_cores, "busy_cores", minimum=1)
    cores = cpu_count()
    settings = oversubscription_settings(cores, busy_cores)
    kwargs = {"batch": positive_int(batch, "batch"), "steps": positive_int(steps, "steps")}
    counts = {policy: sorted({t for t, p in settings.values() if p == policy}) for _, policy in settings.values()}
    runs = {policy: (lambda c=c, p=policy: run_in_fresh_process(
                "labkit.input.oversubscription:time_steps_with_threads",
                dict(thread_counts=c, wait_policy=p, **kwargs), timeout_s=timeout_s))
            for policy, c in counts.items()}
    with spinning_cores(busy_cores):
        by_policy = interleaved(runs, rounds=positive_int(rounds, "rounds"))
    rounds_by_setting = {name: [child[str(threads)] for child in by_policy[policy]]
                         for name, (threads, policy) in settings.items()}
    return OversubscriptionRun({k: v[0] for k, v in settings.items()}, rounds_by_setting, busy_cores, cores)


def judge_oversubscription(run: OversubscriptionRun, *, min_slowdown: float = SLOWER_AT_LEAST,
                            min_cpu_ratio: float = MORE_CPU_AT_LEAST) -> list[Verdict]:
    """The lesson's two claims, through the verdict protocol (the spinning neighbour is the lesson, not noise:
    only the rounds' spread counts as load). Each names its rival, 'no difference' (1.0x), which the threshold
    must exclude: a spinning pool no slower than the matched one, burning no more CPU."""
    claims = []
    for name in ("oversubscribed, spinning",):
        ratios = [o["step_s"] / m["step_s"] for o, m in zip(run.rounds[name], run.rounds["matched"])]
        load = Load({}, spread=relative_spread(ratios))
        claims.append(judge_at_least(f"on a busy core, threads matched to the free cores beat {name} threads",
                                     run.slowdown(name) or 1e-9, min_slowdown, load=load,
                                     rival=Rival("oversubscription costs nothing (1.0x)", 1.0)))
        cpu_ratio = run.median(name, "cpu_s_per_step") / run.median("matched", "cpu_s_per_step")
        claims.append(judge_at_least(f"{name} threads burn more CPU per step than matched ones", cpu_ratio,
                                     min_cpu_ratio, load=load,
                                     rival=Rival("spinning threads burn no extra CPU (1.0x)", 1.0)))
    return claims
