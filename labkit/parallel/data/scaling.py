"""When does data parallelism pay? Real gloo (or NCCL) measurements compared with the performance model.

Each replica count R runs real synchronous-SGD steps on real processes and times compute (T_comp), the
gradient all-reduce (T_sync) and the whole step; a micro-benchmark in the same group fits the all-reduce's
latency and bandwidth. ``compare_with_model`` then predicts each R's speedup from the R=1 compute time,
core sharing and the fitted all-reduce cost (``labkit.parallel.data.costmodel``) and sets it beside the clock.
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from labkit.comm.backend import choose_backend
from labkit.comm.collectives import allreduce_cost
from labkit.comm.launch import launch
from labkit.comm.mesh import new_groups
from labkit.comm.worker import rank_device
from labkit.core.clock import now_s, percentile, thread_time_s
from labkit.core.contention import ShareMeter
from labkit.core.device import device_label
from labkit.core.machine import cpu_count
from labkit.core.models import mlp
from labkit.core.step import TrainStep
from labkit.core.timing import Stopwatch, synchronize
from labkit.core.validation import checked_int, positive_int, positive_ints
from labkit.core.verdict import Load, Rival
from labkit.core.verdict import Verdict as TimingVerdict
from labkit.core.verdict import judge_at_least, judge_at_most
from labkit.parallel.data.costmodel import core_sharing_slowdown, fit_alpha_beta, predicted_speedup
from labkit.parallel.data.sync_sgd import sync_gradients


def timing_noise(times_s: Sequence[float]) -> float:
    """p90/p10 of repeated timings of the same work: 1.0 is perfectly steady."""
    values = [float(t) for t in times_s]
    return percentile(values, 90) / max(percentile(values, 10), 1e-12)


# ---------------------------------------------------------------------------- measuring on real gloo
@dataclass(frozen=True)
class StepTimes:
    """Medians from one real run with ``world_size`` processes; times in seconds."""

    world_size: int
    batch: int
    grad_bytes: int
    t_comp_s: float          # forward + backward + optimizer step
    t_sync_s: float          # the gradient all-reduce, measured inside the step
    step_s: float            # the whole step
    alpha_s: float           # all-reduce latency fitted from a micro-benchmark in the same world
    beta_s_per_byte: float   # ... and inverse bandwidth
    device: str
    step_noise: float = 1.0  # p90/p10 of the step times: ~1.1 on a quiet machine, >1.5 when others compete
    cpu_share: float = 1.0   # min over ranks: share of a core over whole steps (schedstat), capped by compute CPU/wall


def _allreduce_probe(sizes_bytes: list[int], repeats: int, group) -> list[float]:
    """Median time of a float32 all-reduce for each size (barrier first, so skew is not timed)."""
    medians, device = [], rank_device()
    for n in sizes_bytes:
        buf = torch.ones(max(1, n // 4), device=device)
        times = []
        for _ in range(repeats + 1):
            dist.barrier(group=group)
            with Stopwatch(device) as watch:
                dist.all_reduce(buf, group=group)
            times.append(watch.elapsed_s)
        medians.append(statistics.median(times[1:]))
    return medians


class _PhaseTimes:
    """The one step's ``phase``: wall and CPU seconds per phase, the device synchronised where a phase edge is timed
    (after backward, the all-reduce and the update; forward and backward count together as compute)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.wall_s, self.cpu_s = device, {"compute": 0.0, "grads": 0.0}, {"compute": 0.0, "grads": 0.0}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        c0, t0 = thread_time_s(), now_s()
        yield
        if phase in ("backward", "grads", "optimizer"):
            synchronize(self.device)
        key = "grads" if phase == "grads" else "compute"
        self.wall_s[key] += now_s() - t0
        self.cpu_s[key] += thread_time_s() - c0


def _step_phases(step: TrainStep, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float, float]:
    """One sync-SGD step of the kit's one step, synchronised at each phase edge: (compute s, all-reduce s,
    step s, CPU s computing)."""
    times = _PhaseTimes(step.device)
    step(x, y, phase=times)
    compute_s, sync_s = times.wall_s["compute"], times.wall_s["grads"]
    return compute_s, sync_s, compute_s + sync_s, times.cpu_s["compute"]


def _time_steps(world_size: int, group, cfg: dict) -> StepTimes:
    """Time ``cfg['steps']`` real sync-SGD steps of the MLP among the first ``world_size`` ranks."""
    torch.manual_seed(cfg["seed"] + dist.get_rank())
    device = rank_device()
    model = mlp((cfg["in_features"], *[cfg["hidden"]] * cfg["depth"], 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(cfg["batch"], cfg["in_features"], device=device)
    y = torch.randint(0, 10, (cfg["batch"],), device=device)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    all_reduce = (lambda t: dist.all_reduce(t, group=group)) if world_size > 1 else None
    hook = (lambda m: sync_gradients(m, all_reduce, world_size, bucket=True)) if all_reduce is not None else None
    step = TrainStep(model, opt, device=device, grad_hook=hook)
    with ShareMeter() as meter:     # whole steps: a rank descheduled while its peer waits in the all-reduce counts
        phases = [_step_phases(step, x, y) for _ in range(cfg["warmup"] + cfg["steps"])][cfg["warmup"]:]
    comp, sync, step, cpu = ([p[k] for p in phases] for k in range(4))
    cpu_s = sum(cpu)
    alpha = beta = 0.0
    if world_size > 1:
        sizes = [4, 4096, grad_bytes // 4, grad_bytes]
        alpha, beta = fit_alpha_beta(sizes, _allreduce_probe(sizes, 5, group), world_size)
    share = torch.tensor([min(meter.share, cpu_s / sum(comp), 1.0) if device.type == "cpu" else 1.0], device=device)
    if world_size > 1:
        dist.all_reduce(share, op=dist.ReduceOp.MIN, group=group)
    med = statistics.median
    return StepTimes(world_size, cfg["batch"], grad_bytes, med(comp), med(sync), med(step), alpha, beta,
                     device_label(device), timing_noise(step), float(share))


def scaling_sweep_worker(world_sizes: tuple[int, ...] = (1, 2, 4), rounds: int = 2, in_features: int = 1024,
                         hidden: int = 512, depth: int = 2, batch: int = 64, steps: int = 15, warmup: int = 3,
                         seed: int = 0) -> list[StepTimes]:
    """Run inside launch() on max(world_sizes) ranks: each round, for each R the first R ranks train
    while the rest wait at a barrier; rank 0 returns, per R, the round with the fastest step (other
    work on the machine only ever slows a round down)."""
    torch.set_num_threads(1)
    cfg = dict(in_features=in_features, hidden=hidden, depth=depth, batch=batch, steps=steps, warmup=warmup,
               seed=seed)
    members = {size: list(range(size)) for size in world_sizes}
    return sweep_members(members, member_groups(members), rounds, cfg)


def member_groups(members: dict[int, list[int]]) -> dict[int, object]:
    """One process group per entry of ``members`` (every rank must call this, in the same order), through the kit's
    one group builder (:func:`labkit.comm.mesh.new_groups`); None where this rank is not a member."""
    made = new_groups(list(members.values()))
    return {size: (g.group if g is not None else None) for size, g in zip(members, made)}


def sweep_members(members: dict[int, list[int]], groups: dict[int, object], rounds: int, cfg: dict) -> list[StepTimes]:
    """Interleaved rounds: each round, for each R the ranks ``members[R]`` (rank 0 among them) run sync SGD while
    the others wait at a barrier; rank 0 returns, per R, the round with the fastest step. The members may be any
    ranks, e.g. one per node, so the all-reduce crosses the link between nodes."""
    me = dist.get_rank()
    if any(0 not in ranks or len(ranks) != size for size, ranks in members.items()):
        raise ValueError(f"members must map R to R ranks including rank 0, got {members}")
    best: dict[int, StepTimes] = {}
    for _ in range(rounds):
        for size, ranks in members.items():
            if me in ranks:
                run = _time_steps(size, groups[size], cfg)
                if size not in best or run.step_s < best[size].step_s:
                    best[size] = run
            dist.barrier()
    return [best[size] for size in members] if me == 0 else []


def measure_scaling(world_sizes: tuple[int, ...] = (1, 2, 4), *, backend: str = "auto", timeout_s: float = 120.0,
                    **worker_kwargs: int) -> list[StepTimes]:
    """Real runs, one torch thread per rank: T_comp, T_sync and step time for each world size.

    ``backend='auto'`` follows ``labkit.comm.backend.choose_backend``: NCCL on the GPUs when each rank has its
    own, else gloo with every rank a CPU process (print ``choose_backend(max(world_sizes)).reason`` next to the
    numbers so a reader on a 1-GPU box knows they are CPU timings).
    """
    sizes = tuple(sorted(set(positive_ints(world_sizes, "world_sizes"))))
    chosen = choose_backend(max(sizes), backend).backend
    return launch(scaling_sweep_worker, max(sizes), kwargs=dict(world_sizes=sizes, **worker_kwargs),
                  backend=chosen, timeout_s=timeout_s, show_output=False)[0]


def runs_load(runs: Sequence[StepTimes], cores: int) -> Load:
    """How busy a sweep's rounds were: each R's worst CPU share beside what core sharing alone leaves it
    (R ranks on fewer cores get cores/R each by design: that is the lesson, not other programs' load)."""
    shares = {f"the worst of {r.world_size} rank(s)": r.cpu_share / min(1.0, cores / r.world_size) for r in runs}
    return Load.measured(shares, spread=max(0.0, max(r.step_noise for r in runs) - 1))


@dataclass(frozen=True)
class ScalingPoint:
    """Predicted vs measured speedup for one world size (R replicas)."""

    world_size: int
    t_comp_s: float
    t_sync_predicted_s: float
    t_sync_measured_s: float
    compute_slowdown: float
    predicted_speedup: float
    measured_speedup: float

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured: positive when the model is optimistic."""
        return (self.predicted_speedup - self.measured_speedup) / self.measured_speedup


def compare_with_model(runs: list[StepTimes], cores: int, algorithm: str = "ring") -> list[ScalingPoint]:
    """Predict each run's speedup from the R=1 compute time, core sharing and the fitted all-reduce cost."""
    alone = next((r for r in runs if r.world_size == 1), None)
    if alone is None:
        raise ValueError("runs must include world_size=1: it gives T_comp alone and the baseline step time")
    points = []
    for run in runs:
        slowdown = core_sharing_slowdown(run.world_size, cores)
        t_sync = allreduce_cost(algorithm, run.world_size, run.grad_bytes, run.alpha_s, run.beta_s_per_byte)
        measured = run.world_size * alone.step_s / run.step_s        # throughput ratio = epoch-time ratio
        predicted = predicted_speedup(alone.t_comp_s, t_sync, run.world_size, slowdown)
        points.append(ScalingPoint(run.world_size, alone.t_comp_s, t_sync, run.t_sync_s, slowdown, predicted, measured))
    return points


# ---------------------------------------------------------------------------- the verdict, sized to be robust
SIZED_CASES = {   # work sized so "pays / does not pay" is far from the break-even point, whatever else runs
    "compute-bound: 0.5 MB of gradients, batch 2048": dict(in_features=256, hidden=256, depth=2, batch=2048),
    "communication-bound: 25 MB of gradients, batch 1": dict(in_features=1024, hidden=2048, depth=2, batch=1),
}
# NCCL on GPUs moves 25 MB in ~0.1-0.2 ms over NVLink, about what batch 1 computes: too close to call. There the
# compute-bound job does ~200 GFLOP a step (ms of tensor-core work) against 8 MB of gradients, and the
# communication-bound one moves 400 MB (over 1 ms even at NVLink's few hundred GB/s) against ~0.5 ms of compute.
NCCL_SIZED_CASES = {
    "compute-bound: 8 MB of gradients, batch 16384": dict(in_features=1024, hidden=1024, depth=2, batch=16384),
    "communication-bound: 400 MB of gradients, batch 1": dict(in_features=4096, hidden=8192, depth=2, batch=1),
}


def sized_cases(backend: str) -> dict:
    """The two verdict workloads for a backend: CPU gloo ranks and NCCL GPUs sit at very different break-evens."""
    return NCCL_SIZED_CASES if backend == "nccl" else SIZED_CASES


# 1.2: a speed-up within 20% of 1 changes no decision to add a replica, and a quiet run's step times spread ~10%
# (StepTimes.step_noise ~1.1); beyond it the rival, 1.0x, lies outside the band
PAYS_MARGIN = 1.2


@dataclass(frozen=True)
class Verdict:
    """Does adding replicas pay? The model's call (from R=1 compute and the fitted all-reduce) vs the clock."""

    case: str
    world_size: int
    grad_bytes: int
    t_comp_s: float
    t_sync_predicted_s: float
    predicted_speedup: float
    measured_speedup: float
    cpu_shares: tuple[float, float] = (1.0, 1.0)   # worst rank's share of a core computing: R=1, R=world_size
    step_noise: float = 1.0                         # the larger p90/p10 of the two runs' step times

    @property
    def agrees(self) -> bool:
        """True when the model and the clock give the same verdict (both above one, or both not)."""
        return (self.predicted_speedup > 1) == (self.measured_speedup > 1)

    def load(self) -> Load:
        """How busy the measured rounds were: each run's worst CPU share and the step times' spread."""
        shares = {"the single replica": self.cpu_shares[0], f"the worst of {self.world_size} ranks":
                  self.cpu_shares[1]}
        return Load.measured(shares, spread=max(0.0, self.step_noise - 1))

    def judge_pays(self, claim: str) -> TimingVerdict:
        """The model says adding replicas pays, and the clock agrees by PAYS_MARGIN (rival: it gains nothing)."""
        if self.predicted_speedup <= PAYS_MARGIN:
            return TimingVerdict(claim, "failed", f"the model predicted {self.predicted_speedup:.2f}x: no clear gain")
        return judge_at_least(claim, self.measured_speedup, PAYS_MARGIN, load=self.load(),
                              rival=Rival("a second replica gains nothing", 1.0))

    def judge_slows(self, claim: str) -> TimingVerdict:
        """The clock shows adding replicas slows this job down by PAYS_MARGIN (rival: it costs nothing)."""
        return judge_at_most(claim, self.measured_speedup, 1.0 / PAYS_MARGIN, load=self.load(),
                             rival=Rival("a second replica costs nothing", 1.0))

    def judge_ranks_above(self, other: "Verdict", claim: str) -> TimingVerdict:
        """The model ranks this job's speed-up above ``other``'s and the clock agrees by PAYS_MARGIN (rival: the
        replica count alone sets the speed-up, so both jobs scale alike)."""
        if self.predicted_speedup <= other.predicted_speedup:
            return TimingVerdict(claim, "failed", f"the model ranks them the other way: predicted "
                                                  f"{self.predicted_speedup:.2f}x vs {other.predicted_speedup:.2f}x")
        load = Load.measured({"this job's worst rank": min(self.cpu_shares), "the other's": min(other.cpu_shares)},
                             spread=max(0.0, max(self.step_noise, other.step_noise) - 1))
        return judge_at_least(claim, self.measured_speedup / other.measured_speedup, PAYS_MARGIN, load=load,
                              rival=Rival("both jobs scale alike", 1.0))


def verdict_worker(cases: dict, world_size: int, rounds: int, steps: int) -> dict:
    """Run inside launch(): every sized case in one process group (one start-up for all of them)."""
    return {case: scaling_sweep_worker((1, world_size), rounds=rounds, steps=steps, **kwargs)
            for case, kwargs in cases.items()}


def pays_verdicts(world_size: int = 2, cases: dict | None = None, *, rounds: int = 3, steps: int = 6,
                  cores: int | None = None, backend: str = "auto", timeout_s: float = 120.0) -> list[Verdict]:
    """Measure R=1 vs R=``world_size`` for each sized case (interleaved rounds, fastest round) and compare."""
    checked_int(world_size, "world_size", minimum=2, hint="the verdict compares one replica with more")
    rounds, steps = positive_int(rounds, "rounds"), positive_int(steps, "steps")
    chosen = choose_backend(world_size, backend).backend
    cases = cases or sized_cases(chosen)
    kwargs = dict(cases=cases, world_size=world_size, rounds=rounds, steps=steps)
    by_case = launch(verdict_worker, world_size, kwargs=kwargs, backend=chosen, timeout_s=timeout_s,
                     show_output=False)[0]
    verdicts = []
    for case, runs in by_case.items():
        point = compare_with_model(runs, cores or cpu_count())[-1]
        verdicts.append(Verdict(case, world_size, runs[-1].grad_bytes, point.t_comp_s, point.t_sync_predicted_s,
                                point.predicted_speedup, point.measured_speedup,
                                (runs[0].cpu_share, runs[-1].cpu_share), max(r.step_noise for r in runs)))
    return verdicts
