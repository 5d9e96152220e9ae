"""The gradient noise scale B_simple = tr(Sigma) / |G|^2, measured live (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", arXiv 1812.06162): the batch size above which a bigger batch buys little per step.

Neither tr(Sigma) nor |G|^2 is seen directly, but a batch of B samples drawn with replacement has
E|G_B|^2 = |G|^2 + tr(Sigma)/B, so the squared norms of two gradients at batch sizes b_small < b_big give both
unbiasedly (their appendix A.1). Two sources of such pairs: two batch sizes in one process
(:func:`measure_two_batch`), and data-parallel ranks, where each replica's gradient is the small batch and the
all-reduced one the big batch (:func:`dp_noise_scale`, real gloo ranks). As in the paper, |G|^2 and tr(Sigma) are
averaged over many pairs before their ratio is taken (a ratio of noisy means, not a mean of noisy ratios); the
uncertainty is the delta-method standard error of that ratio.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from labkit.comm.launch import launch
from labkit.core.data import make_loader
from labkit.core.env import seed_everything
from labkit.core.step import TrainStep
from labkit.core.validation import checked_int, positive_int
from labkit.training.config import TrainConfig
from labkit.training.loop import train


def two_norm_estimate(small_sq_norm: float, big_sq_norm: float, b_small: int, b_big: int) -> tuple[float, float]:
    """Unbiased (|G|^2, tr(Sigma)) from |G_small|^2 and |G_big|^2 at two batch sizes (McCandlish et al., A.1)."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small!r}, b_big={b_big!r}")
    grad_sq = (b_big * big_sq_norm - b_small * small_sq_norm) / (b_big - b_small)
    trace_sigma = (small_sq_norm - big_sq_norm) / (1.0 / b_small - 1.0 / b_big)
    return grad_sq, trace_sigma


@dataclass(frozen=True)
class NoiseScale:
    """B_simple with its standard error, and the averaged |G|^2 and tr(Sigma) it is the ratio of."""

    b_simple: float
    stderr: float
    grad_sq: float
    trace_sigma: float
    pairs: int
    b_small: int
    b_big: int
    source: str = "two batch sizes"

    @property
    def relative_error(self) -> float:
        """stderr / B_simple (inf where B_simple is not positive: |G|^2 lost in the noise)."""
        return self.stderr / self.b_simple if self.b_simple > 0 else math.inf

    def __str__(self) -> str:
        return (f"B_simple = {self.b_simple:.0f} ± {self.stderr:.0f} samples ({self.source}: {self.pairs} pairs of "
                f"batch {self.b_small} vs {self.b_big})")


def noise_scale_from_norms(small_sq_norms: Sequence[float], big_sq_norms: Sequence[float], b_small: int, b_big: int,
                           source: str = "two batch sizes") -> NoiseScale:
    """B_simple = mean tr(Sigma) / mean |G|^2 over paired squared norms, with its delta-method standard error."""
    if len(small_sq_norms) != len(big_sq_norms) or len(small_sq_norms) < 2:
        raise ValueError(f"need two or more paired squared norms, got {len(small_sq_norms)} and {len(big_sq_norms)}")
    pairs = [two_norm_estimate(s, b, b_small, b_big) for s, b in zip(small_sq_norms, big_sq_norms)]
    g = [p[0] for p in pairs]
    s = [p[1] for p in pairs]
    n, g_mean, s_mean = len(pairs), statistics.fmean(g), statistics.fmean(s)
    ratio = s_mean / g_mean
    cov = sum((a - g_mean) * (b - s_mean) for a, b in zip(g, s)) / (n - 1)
    rel_var = (statistics.variance(s) / s_mean ** 2 + statistics.variance(g) / g_mean ** 2
               - 2 * cov / (s_mean * g_mean)) / n
    return NoiseScale(ratio, abs(ratio) * math.sqrt(max(rel_var, 0.0)), g_mean, s_mean, n, b_small, b_big, source)


def _sq_norm(model: nn.Module) -> float:
    return float(sum(p.grad.detach().float().pow(2).sum() for p in model.parameters() if p.grad is not None))


def gradient_sq_norm(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """|grad of the mean loss over (x, y)|^2, from the kit's one step (forward and backward, no update)."""
    seen: list[float] = []
    TrainStep(model, None, grad_hook=lambda m: seen.append(_sq_norm(m)))(x, y)
    return seen[0]


def _draw(dataset: Dataset, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples drawn with replacement (so E|G_B|^2 = |G|^2 + tr(Sigma)/B holds exactly)."""
    idx = torch.randint(len(dataset), (n,), generator=generator).tolist()
    xs, ys = zip(*dataset.__getitems__(idx)) if hasattr(dataset, "__getitems__") else zip(*(dataset[i] for i in idx))
    return torch.stack(xs), torch.stack([torch.as_tensor(v) for v in ys])


def measure_two_batch(model: nn.Module, dataset: Dataset, b_small: int, b_big: int, *, pairs: int = 20,
                      seed: int = 0) -> NoiseScale:
    """B_simple at the model's current weights from ``pairs`` gradients at each of two batch sizes, one process."""
    positive_int(pairs, "pairs")
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small!r} and {b_big!r}")
    gen = torch.Generator().manual_seed(seed)
    small, big = [], []
    for _ in range(pairs):
        small.append(gradient_sq_norm(model, *_draw(dataset, b_small, gen)))
        big.append(gradient_sq_norm(model, *_draw(dataset, b_big, gen)))
    return noise_scale_from_norms(small, big, b_small, b_big)


def dp_norms_worker(job: dict) -> dict:
    """One rank: ``pairs`` local gradients at the given weights; its squared norm, then the all-reduced one's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = job["model_fn"]()
    model.load_state_dict(job["state"])
    gen = torch.Generator().manual_seed(job["seed"] * 1000 + rank)        # each replica draws its own batch
    local, averaged = [], []

    def all_reduce(m: nn.Module) -> None:
        local.append(_sq_norm(m))                                         # the replica's small-batch gradient
        for p in m.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(world)                                            # the mean: the big batch's gradient
        averaged.append(_sq_norm(m))

    step = TrainStep(model, None, grad_hook=all_reduce)
    for _ in range(job["pairs"]):
        step(*_draw(job["train"], job["local_batch"], gen))
    return {"local": local, "averaged": averaged}


def dp_noise_scale(model_fn: Callable[[], nn.Module], state: dict, dataset: Dataset, local_batch: int, *, world_size: int = 2, pairs: int = 20,
                   seed: int = 0, timeout_s: float = 120.0) -> NoiseScale:
    """B_simple from per-replica vs all-reduced gradient norms on ``world_size`` real ranks (``launch``: gloo on
    CPU, under a timeout, processes cleaned up): the noise scale a data-parallel run gets for free."""
    checked_int(world_size, "world_size", minimum=2)
    seed_everything(seed)
    job = {"model_fn": model_fn, "state": state, "train": dataset, "local_batch": local_batch, "pairs": pairs,
           "seed": seed}
    ranks = launch(dp_norms_worker, world_size, args=(job,), timeout_s=timeout_s, show_output=False)
    small = [statistics.fmean(r["local"][i] for r in ranks) for i in range(pairs)]   # every replica is a small batch
    return noise_scale_from_norms(small, ranks[0]["averaged"], local_batch, local_batch * world_size,
                                  source=f"{world_size} gloo ranks")


def noise_scale_during_training(model: nn.Module, dataset: Dataset, config: TrainConfig, b_small: int, b_big: int, *, every: int,
                                pairs: int = 15) -> list[tuple[int, float, NoiseScale]]:
    """Train ``model`` with the kit's loop (``config``, its run's batch size and seed) and measure B_simple at its
    weights every ``every`` steps: (step, training loss, NoiseScale) per point. The measurement's time counts nowhere."""
    points: list[tuple[int, float, NoiseScale]] = []

    def measure(record, progress) -> None:
        ns = measure_two_batch(progress.model, dataset, b_small, b_big, pairs=pairs, seed=record.step)
        points.append((record.step + 1, record.loss, ns))

    loader = make_loader(dataset, config.spec.batch_size, shuffle=True, drop_last=True, seed=config.spec.seed)
    train(model, loader, dataclasses.replace(config, log_every=every, read_every=every, progress=False),
          callback=measure)
    return points


def pooled(estimates: Sequence[NoiseScale]) -> NoiseScale:
    """Several B_simple estimates combined in log space, weighted by 1 / relative error^2 (a scale's errors are
    multiplicative: weighting by absolute error would favour the smallest estimates), e.g. a run's later points."""
    usable = [e for e in estimates if e.b_simple > 0 and 0 < e.stderr < math.inf]
    if not usable:
        raise ValueError("no positive estimate with a finite, positive standard error to pool")
    weights = [1.0 / e.relative_error ** 2 for e in usable]
    log_mean = sum(w * math.log(e.b_simple) for w, e in zip(weights, usable)) / sum(weights)
    mean = math.exp(log_mean)
    first = usable[0]
    return NoiseScale(mean, mean / math.sqrt(sum(weights)), statistics.fmean(e.grad_sq for e in usable),
                      statistics.fmean(e.trace_sigma for e in usable), sum(e.pairs for e in usable), first.b_small,
                      first.b_big, f"{first.source}, {len(usable)} points pooled")
