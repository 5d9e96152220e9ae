"""When does data parallelism pay? The performance model, real gloo measurements, published points.

One epoch of N samples at per-replica batch B takes ``(N/B) * T_comp`` on one worker and
``(N/(R*B)) * (T_comp + T_sync)`` on R replicas, so replicas pay when ``T_sync < (R-1) * T_comp``;
hence "the per-worker workload must be large" (Goyal et al. 2017, "Accurate, Large Minibatch SGD",
abstract). ``T_sync`` comes from the alpha-beta cost of an all-reduce of the
gradient bytes (``labkit.comm.collectives.allreduce_cost``; Patarasuk & Yuan 2009 for the ring).
On a CPU box with fewer cores than replicas the replicas share cores, so ``T_comp`` grows by
``R * threads / cores``: the model says so rather than hiding it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from labkit.comm.collectives import allreduce_cost
from labkit.core.data import verify_data_file

PUBLISHED_FILE = "published_scaling.csv"


# ---------------------------------------------------------------------------- the model
def epoch_time_s(n_samples: int, batch: int, t_comp_s: float, t_sync_s: float = 0.0, replicas: int = 1) -> float:
    """Epoch time: (N/B)*T_comp alone, (N/(R*B))*(T_comp + T_sync) with R replicas."""
    _check_positive(n_samples=n_samples, batch=batch, replicas=replicas)
    if t_comp_s <= 0 or t_sync_s < 0:
        raise ValueError(f"need t_comp_s > 0 and t_sync_s >= 0, got {t_comp_s}, {t_sync_s}")
    if replicas == 1:
        return n_samples / batch * t_comp_s
    return n_samples / (replicas * batch) * (t_comp_s + t_sync_s)


def predicted_speedup(t_comp_s: float, t_sync_s: float, replicas: int, compute_slowdown: float = 1.0) -> float:
    """Epoch-time ratio alone / with R replicas: R*T_comp / (slowdown*T_comp + T_sync)."""
    _check_positive(replicas=replicas)
    if replicas == 1:
        return 1.0
    return replicas * t_comp_s / (compute_slowdown * t_comp_s + t_sync_s)


def pays_off(t_comp_s: float, t_sync_s: float, replicas: int) -> bool:
    """True when R replicas beat one: T_sync < (R-1) * T_comp."""
    return t_sync_s < (replicas - 1) * t_comp_s


def sync_time_s(nbytes: int, replicas: int, latency_s: float, bandwidth_bytes_per_s: float,
                algorithm: str = "ring") -> float:
    """T_sync of an all-reduce of ``nbytes`` gradients: the alpha-beta model with beta = 1/bandwidth."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s}")
    return allreduce_cost(algorithm, replicas, int(nbytes), latency_s, 1.0 / bandwidth_bytes_per_s)


def core_sharing_slowdown(replicas: int, cores: int, threads_per_rank: int = 1) -> float:
    """How much slower each replica computes when R*threads exceed the cores (1.0 when they fit)."""
    _check_positive(replicas=replicas, cores=cores, threads_per_rank=threads_per_rank)
    return max(1.0, replicas * threads_per_rank / cores)


def fit_alpha_beta(sizes_bytes, times_s, workers: int, algorithm: str = "ring") -> tuple[float, float]:
    """Least-squares latency alpha (s) and inverse bandwidth beta (s/byte) from all-reduce timings."""
    sizes = np.asarray(sizes_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if len(sizes) < 2 or len(sizes) != len(times):
        raise ValueError("need at least two (size, time) pairs of equal length to fit alpha and beta")
    if workers < 2:
        return 0.0, 0.0
    # the model is linear in (alpha, beta): cost = a_coef*alpha + b_coef(n)*beta
    a_coef = np.array([allreduce_cost(algorithm, workers, int(n), 1.0, 0.0) for n in sizes])
    b_coef = np.array([allreduce_cost(algorithm, workers, int(n), 0.0, 1.0) for n in sizes])
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([a_coef, b_coef], 1), times, rcond=None)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


QUIET_NOISE_MAX = 1.5   # p90/p10 of repeated timings above this: the machine is busy, timings not trustworthy


def timing_noise(times_s) -> float:
    """p90/p10 of repeated timings of the same work: 1.0 is perfectly steady."""
    from labkit.core.clock import percentile

    values = [float(t) for t in times_s]
    return percentile(values, 90) / max(percentile(values, 10), 1e-12)


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


# ---------------------------------------------------------------------------- measuring on real gloo
@dataclass(frozen=True)
class StepTimes:
    """Medians from one real run with ``replicas`` processes; times in seconds."""

    replicas: int
    batch: int
    grad_bytes: int
    t_comp_s: float          # forward + backward + optimizer step
    t_sync_s: float          # the gradient all-reduce, measured inside the step
    step_s: float            # the whole step
    alpha_s: float           # all-reduce latency fitted from a micro-benchmark in the same world
    beta_s_per_byte: float   # ... and inverse bandwidth
    device: str
    step_noise: float = 1.0  # p90/p10 of the step times: ~1.1 on a quiet machine, >1.5 when others compete
    cpu_share: float = 1.0   # min over ranks of CPU time / wall time while computing (cores/R when R > cores)


def _mlp(in_features: int, hidden: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(in_features, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 10))


def _rank_device() -> torch.device:
    """This rank's GPU under NCCL (one GPU per rank), else the CPU: the one backend rule decides."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _sync(device: torch.device) -> None:
    """Wait for the GPU before reading the clock (a no-op on CPU): only at step/phase edges we report."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allreduce_probe(sizes_bytes: list[int], repeats: int, group) -> list[float]:
    """Median time of a float32 all-reduce for each size (barrier first, so skew is not timed)."""
    medians, device = [], _rank_device()
    for n in sizes_bytes:
        buf = torch.ones(max(1, n // 4), device=device)
        times = []
        for _ in range(repeats + 1):
            dist.barrier(group=group)
            _sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=group)
            _sync(device)
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times[1:]))
    return medians


def _time_steps(replicas: int, group, cfg: dict) -> StepTimes:
    """Time ``cfg['steps']`` real sync-SGD steps of the MLP among the first ``replicas`` ranks."""
    from labkit.core.device import device_label
    from labkit.parallel.sync_sgd import sync_gradients

    torch.manual_seed(cfg["seed"] + dist.get_rank())
    device = _rank_device()
    model = _mlp(cfg["in_features"], cfg["hidden"], cfg["depth"]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(cfg["batch"], cfg["in_features"], device=device)
    y = torch.randint(0, 10, (cfg["batch"],), device=device)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    comp, sync, step, cpu_s = [], [], [], 0.0
    for i in range(cfg["warmup"] + cfg["steps"]):
        c0, t0 = time.thread_time(), time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        _sync(device)
        c1, t1 = time.thread_time(), time.perf_counter()
        if replicas > 1:
            sync_gradients(model, lambda t: dist.all_reduce(t, group=group), replicas, bucket=True)
            _sync(device)
        c2, t2 = time.thread_time(), time.perf_counter()
        opt.step()
        _sync(device)
        c3, t3 = time.thread_time(), time.perf_counter()
        if i >= cfg["warmup"]:
            cpu_s += (c1 - c0) + (c3 - c2)
            comp.append((t1 - t0) + (t3 - t2))
            sync.append(t2 - t1)
            step.append(t3 - t0)
    alpha = beta = 0.0
    if replicas > 1:
        sizes = [4, 4096, grad_bytes // 4, grad_bytes]
        alpha, beta = fit_alpha_beta(sizes, _allreduce_probe(sizes, 5, group), replicas)
    share = torch.tensor([cpu_s / sum(comp) if device.type == "cpu" else 1.0], device=device)
    if replicas > 1:
        dist.all_reduce(share, op=dist.ReduceOp.MIN, group=group)
    med = statistics.median
    return StepTimes(replicas, cfg["batch"], grad_bytes, med(comp), med(sync), med(step), alpha, beta,
                     device_label(device), timing_noise(step), float(share))


def scaling_sweep_worker(replica_counts: tuple[int, ...] = (1, 2, 4), rounds: int = 2, in_features: int = 1024,
                         hidden: int = 512, depth: int = 2, batch: int = 64, steps: int = 15, warmup: int = 3,
                         seed: int = 0) -> list[StepTimes]:
    """Run inside launch() on max(replica_counts) ranks: each round, for each R the first R ranks train
    while the rest wait at a barrier; rank 0 returns, per R, the round with the fastest step (other
    work on the machine only ever slows a round down)."""
    torch.set_num_threads(1)
    cfg = dict(in_features=in_features, hidden=hidden, depth=depth, batch=batch, steps=steps, warmup=warmup,
               seed=seed)
    groups = {r: dist.new_group(list(range(r))) for r in replica_counts}   # every rank creates every group
    best: dict[int, StepTimes] = {}
    for _ in range(rounds):
        for r in replica_counts:
            if dist.get_rank() < r:
                run = _time_steps(r, groups[r], cfg)
                if r not in best or run.step_s < best[r].step_s:
                    best[r] = run
            dist.barrier()
    return [best[r] for r in replica_counts] if dist.get_rank() == 0 else []


def measure_scaling(replica_counts: tuple[int, ...] = (1, 2, 4), *, backend: str = "auto", timeout_s: float = 120.0,
                    **worker_kwargs) -> list[StepTimes]:
    """Real runs, one torch thread per rank: T_comp, T_sync and step time for each replica count.

    ``backend='auto'`` follows ``labkit.comm.backend.choose_backend``: NCCL on the GPUs when each rank has its
    own, else gloo with every rank a CPU process (print ``choose_backend(max(counts)).reason`` next to the
    numbers so a reader on a 1-GPU box knows they are CPU timings).
    """
    from labkit.comm.backend import choose_backend
    from labkit.comm.launch import launch

    if not replica_counts or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in replica_counts):
        raise ValueError(f"replica_counts must be integers >= 1, got {replica_counts!r}")
    counts = tuple(sorted(set(int(r) for r in replica_counts)))
    chosen = choose_backend(max(counts), backend).backend
    return launch(scaling_sweep_worker, max(counts), kwargs=dict(replica_counts=counts, **worker_kwargs),
                  backend=chosen, timeout_s=timeout_s, show_output=False)[0]


@dataclass(frozen=True)
class ScalingPoint:
    """Predicted vs measured speedup for one replica count."""

    replicas: int
    t_comp_s: float
    t_sync_predicted_s: float
    t_sync_measured_s: float
    compute_slowdown: float
    predicted_speedup: float
    measured_speedup: float

    @property
    def relative_error(self) -> float:
        return (self.predicted_speedup - self.measured_speedup) / self.measured_speedup


def compare_with_model(runs: list[StepTimes], cores: int, algorithm: str = "ring") -> list[ScalingPoint]:
    """Predict each run's speedup from the R=1 compute time, core sharing and the fitted all-reduce cost."""
    alone = next((r for r in runs if r.replicas == 1), None)
    if alone is None:
        raise ValueError("runs must include replicas=1: it gives T_comp alone and the baseline step time")
    points = []
    for run in runs:
        slowdown = core_sharing_slowdown(run.replicas, cores)
        t_sync = allreduce_cost(algorithm, run.replicas, run.grad_bytes, run.alpha_s, run.beta_s_per_byte)
        measured = run.replicas * alone.step_s / run.step_s        # throughput ratio = epoch-time ratio
        predicted = predicted_speedup(alone.t_comp_s, t_sync, run.replicas, slowdown)
        points.append(ScalingPoint(run.replicas, alone.t_comp_s, t_sync, run.t_sync_s, slowdown, predicted, measured))
    return points


def machine_is_quiet(runs: list[StepTimes], cores: int | None = None) -> bool:
    """True when nothing else competed for the cores: the R=1 baseline was steady (p90/p10 <= QUIET_NOISE_MAX)
    and every run's ranks got at least 75% of the CPU the hardware allows them (min(1, cores/R))."""
    from labkit.core.machine import cpu_count

    cores = cores or cpu_count()
    alone = next(r for r in runs if r.replicas == 1)
    starved = [r for r in runs if r.cpu_share < 0.75 * min(1.0, cores / r.replicas)]
    return alone.step_noise <= QUIET_NOISE_MAX and not starved


def points_to_dataframe(points: list[ScalingPoint]):
    """A table of ScalingPoints (with relative_error) as a pandas DataFrame."""
    import pandas as pd

    return pd.DataFrame([{**asdict(p), "relative_error": p.relative_error} for p in points])


# ---------------------------------------------------------------------------- published points
def load_published_scaling():
    """The cited published scaling points (``data/published_scaling.csv``, checksum verified)."""
    import pandas as pd

    return pd.read_csv(verify_data_file(PUBLISHED_FILE), comment="#")


def plot_published_scaling(df=None, ax=None):
    """Published speedups over each paper's baseline against ideal linear scaling (log-log)."""
    import matplotlib.pyplot as plt

    df = load_published_scaling() if df is None else df
    ax = ax or plt.subplots(figsize=(5, 4))[1]
    scale = df["workers"] / df["baseline_workers"]
    top = float(scale.max())
    ax.plot([1, top], [1, top], "k--", lw=1, label="ideal (linear)")
    for (source, setup), group in df.assign(scale=scale).groupby(["source", "setup"]):
        ax.plot(group["scale"], group["speedup_vs_baseline"], "o-", label=f"{setup}\n({source})")
    ax.set(xlabel="workers / baseline workers", ylabel="speedup over baseline", xscale="log", yscale="log",
           title="Published data-parallel scaling")
    ax.legend(fontsize=7)
    return ax


def plot_predicted_vs_measured(points: list[ScalingPoint], ax=None):
    """Bar chart of predicted and measured speedup per replica count, with ideal R marked."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    xs = np.arange(len(points))
    ax.bar(xs - 0.2, [p.predicted_speedup for p in points], 0.4, label="predicted")
    ax.bar(xs + 0.2, [p.measured_speedup for p in points], 0.4, label="measured")
    ax.plot(xs, [p.replicas for p in points], "k_", ms=30, label="ideal (R)")
    ax.set_xticks(xs, [f"R={p.replicas}" for p in points])
    ax.set(ylabel="speedup over R=1", title="Data-parallel speedup: model vs measurement")
    ax.legend(fontsize=8)
    return ax


# ---------------------------------------------------------------------------- the verdict, sized to be robust
SIZED_CASES = {   # work sized so "pays / does not pay" is far from the break-even point, whatever else runs
    "compute-bound: 0.5 MB of gradients, batch 2048": dict(in_features=256, hidden=256, depth=2, batch=2048),
    "communication-bound: 25 MB of gradients, batch 1": dict(in_features=1024, hidden=2048, depth=2, batch=1),
}


@dataclass(frozen=True)
class Verdict:
    """Does adding replicas pay? The model's call (from R=1 compute and the fitted all-reduce) vs the clock."""

    case: str
    replicas: int
    grad_bytes: int
    t_comp_s: float
    t_sync_predicted_s: float
    predicted_speedup: float
    measured_speedup: float

    @property
    def agrees(self) -> bool:
        return (self.predicted_speedup > 1) == (self.measured_speedup > 1)


def verdict_worker(cases: dict, replicas: int, rounds: int, steps: int) -> dict:
    """Run inside launch(): every sized case in one process group (one start-up for all of them)."""
    return {case: scaling_sweep_worker((1, replicas), rounds=rounds, steps=steps, **kwargs)
            for case, kwargs in cases.items()}


def pays_verdicts(replicas: int = 2, cases: dict | None = None, *, rounds: int = 3, steps: int = 6,
                  cores: int | None = None, backend: str = "auto", timeout_s: float = 120.0) -> list[Verdict]:
    """Measure R=1 vs R=``replicas`` for each sized case (interleaved rounds, fastest round) and compare."""
    from labkit.comm.backend import choose_backend
    from labkit.comm.launch import launch
    from labkit.core.machine import cpu_count

    cases = cases or SIZED_CASES
    by_case = launch(verdict_worker, replicas, kwargs=dict(cases=cases, replicas=replicas, rounds=rounds, steps=steps),
                     backend=choose_backend(replicas, backend).backend, timeout_s=timeout_s, show_output=False)[0]
    verdicts = []
    for case, runs in by_case.items():
        point = compare_with_model(runs, cores or cpu_count())[-1]
        verdicts.append(Verdict(case, replicas, runs[-1].grad_bytes, point.t_comp_s, point.t_sync_predicted_s,
                                point.predicted_speedup, point.measured_speedup))
    return verdicts
