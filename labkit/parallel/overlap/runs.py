"""Overlap on real ranks: the hand-written syncs against DDP's gradients, and every sync timed in interleaved rounds.

Run inside :func:`labkit.comm.launch.launch` (:func:`run_gradient_check` and :func:`run_overlap_timing` do that).
Every rank builds the same seeded MLP and takes its own slice of one global batch; each step is the kit's one
training step (``TrainStep`` without an optimizer), its ``grad_hook`` the sync's ``finish``. Timing runs each
variant once per round, in rotated order, after a barrier, and reports this rank's CPU share over all rounds.
"""
from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from labkit.cluster.linkfit import fit_alpha_beta
from labkit.comm.launch import launch
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.step import TrainStep
from labkit.core.validation import positive_int
from labkit.parallel.overlap.grad_sync import GradSync, record_layer_backward

FIT_SIZES_BYTES = (4 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20)


@dataclass(frozen=True)
class OverlapConfig:
    """The model (``depth`` square linears of ``width``), the global batch, the bucket caps to sweep and the rounds."""

    width: int = 512
    depth: int = 8
    batch: int = 128
    caps_bytes: tuple[float, ...] = (0, 64 << 10, 256 << 10, 1 << 20, 4 << 20, math.inf)
    rounds: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("width", "depth", "batch", "rounds"):
            positive_int(getattr(self, name), name)
        if not self.caps_bytes or any(not c >= 0 for c in self.caps_bytes):
            raise ValueError(f"caps_bytes must be bucket caps >= 0 (math.inf: one bucket), got {self.caps_bytes}")

    @classmethod
    def smoke(cls) -> "OverlapConfig":
        """A tiny model and two rounds, for tests."""
        return cls(width=64, depth=3, batch=8, caps_bytes=(0, 16 << 10, math.inf), rounds=2)

    @property
    def grad_bytes(self) -> int:
        """fp32 bytes of every gradient: the all-reduce's payload per step."""
        return 4 * self.depth * (self.width * self.width + self.width)


def build_mlp(cfg: OverlapConfig) -> nn.Sequential:
    """``depth`` Linear(width, width) layers with ReLU between, seeded: the same on every rank."""
    torch.manual_seed(cfg.seed)
    layers: list[nn.Module] = []
    for i in range(cfg.depth):
        layers += [nn.Linear(cfg.width, cfg.width)] + ([nn.ReLU()] if i < cfg.depth - 1 else [])
    return nn.Sequential(*layers)


def rank_batch(cfg: OverlapConfig, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous slice of one seeded global batch (x, target), each (batch / world_size, width)."""
    if cfg.batch % world_size:
        raise ValueError(f"batch {cfg.batch} does not split over {world_size} ranks")
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x, y = torch.randn(cfg.batch, cfg.width, generator=gen), torch.randn(cfg.batch, cfg.width, generator=gen)
    per = cfg.batch // world_size
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def _step(model: nn.Module, grad_hook, phase=None, x=None, y=None) -> None:  # noqa: ANN001 - private
    TrainStep(model, None, loss_fn=nn.functional.mse_loss, grad_hook=grad_hook)(x, y, phase=phase)


def _relative_gap(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    scale = max(float(w.abs().max()) for w in want.values())
    return max(float((got[k] - w).abs().max()) for k, w in want.items()) / max(scale, 1e-30)


def gradient_check_worker(cfg_dict: dict, cap_bytes: float = 64 << 10) -> dict:
    """Run inside ``launch``: each sync's averaged gradients against DDP's, as the largest relative gap."""
    cfg = OverlapConfig(**cfg_dict)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = rank_batch(cfg, rank, world)

    def grads_of(model: nn.Module, sync: GradSync | None) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}

        def keep(m: nn.Module) -> None:
            if sync is not None:
                sync.finish()
            out.update({n: p.grad.detach().clone() for n, p in m.named_parameters()})
        _step(model, keep, x=x, y=y)
        return out

    ddp = nn.parallel.DistributedDataParallel(build_mlp(cfg))
    want = {n.removeprefix("module."): g for n, g in grads_of(ddp, None).items()}
    gaps, buckets = {}, {}
    for mode in ("naive", "per_param", "bucketed"):
        model = build_mlp(cfg)
        sync = GradSync(model, mode, cap_bytes)
        gaps[mode] = _relative_gap(grads_of(model, sync), want)
        buckets[mode] = len(sync.buckets)
        sync.remove()
    return {"rank": rank, "gaps": gaps, "buckets": buckets}


def run_gradient_check(cfg: OverlapConfig, world_size: int = 2, timeout_s: float = 120.0,
                       cap_bytes: float = 64 << 10) -> list[dict]:
    """Launch :func:`gradient_check_worker` on ``world_size`` gloo ranks (CPU tensors on any machine); one result
    per rank."""
    return launch(gradient_check_worker, world_size, args=(asdict(cfg), cap_bytes), timeout_s=timeout_s, backend="gloo",
                  show_output=False)


FIT_TRIES = 3     # a fit whose slope comes out flat is re-measured with twice the repeats, at most this many times


def fit_allreduce(sizes_bytes: tuple[int, ...] = FIT_SIZES_BYTES, repeats: int = 5) -> dict:
    """Median seconds of a blocking all-reduce per size and its alpha-beta fit, as :func:`labkit.cluster.linkfit.fit_links`
    fits a link: alpha from the tiniest message, beta the slope through the larger ones.

    The sizes are interleaved within each repeat, so a burst of load lands on all of them alike, and every rank fits
    the same numbers: per size the slowest rank's median (an all-reduce ends when its last rank does). A slope that
    still comes out flat (a busy CI run measured beta < 0 once) is measured again with twice the repeats; the ranks
    take that decision together, so none waits in a collective the others skipped."""
    for attempt in range(FIT_TRIES):
        times = _allreduce_medians(sizes_bytes, repeats << attempt)
        sizes = sorted(times)
        try:
            slope = fit_alpha_beta(sizes[1:], [times[n] for n in sizes[1:]])   # beta: the slope through the larger
        except ValueError:
            if attempt == FIT_TRIES - 1:
                raise ValueError(f"the all-reduce's time did not grow with its size in {FIT_TRIES} tries (medians "
                                 f"{', '.join(f'{n} B: {1e6 * t:.0f} us' for n, t in times.items())}): the machine "
                                 "is too busy to fit alpha-beta; close other programs and rerun") from None
            continue
        alpha = max(0.0, times[sizes[0]] - sizes[0] * slope.beta_s_per_byte)  # alpha: the tiny message's own time
        return {"times_s": times, "alpha_s": alpha, "beta_s_per_byte": slope.beta_s_per_byte,
                "r_squared": slope.r_squared, "repeats": repeats << attempt}
    raise AssertionError("unreachable")


def _allreduce_medians(sizes_bytes: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Per size, the slowest rank's median seconds of a blocking all-reduce, sizes interleaved in every repeat."""
    tensors = {n: torch.ones(n // 4) for n in sizes_bytes}
    for t in tensors.values():
        dist.all_reduce(t)                                      # warm-up: the connection, the buffer
    runs: dict[int, list[float]] = {n: [] for n in sizes_bytes}
    for _ in range(repeats):
        for nbytes, t in tensors.items():
            dist.barrier()
            start = now_s()
            dist.all_reduce(t)
            runs[nbytes].append(now_s() - start)
    medians = torch.tensor([statistics.median(runs[n]) for n in sizes_bytes], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)              # one set of numbers on every rank: one decision
    return dict(zip(sizes_bytes, medians.tolist()))


def variant_names(cfg: OverlapConfig) -> list[str]:
    """'none' (no communication), 'naive', then 'cap=<bytes>' per swept bucket cap."""
    return ["none", "naive"] + [f"cap={int(c)}" if math.isfinite(c) else "cap=inf" for c in cfg.caps_bytes]


def _make_variant(cfg: OverlapConfig, name: str) -> tuple[nn.Module, GradSync | None]:
    model = build_mlp(cfg)
    if name == "none":
        return model, None
    if name == "naive":
        return model, GradSync(model, "naive")
    cap = float(name.removeprefix("cap="))
    return model, GradSync(model, "per_param" if cap == 0 else "bucketed", cap)


def _timed_step(model: nn.Module, sync: GradSync | None, timeline, x: torch.Tensor, y: torch.Tensor) -> dict:  # noqa: ANN001
    """One step: phase times (forward, backward, wait), layer backward spans and bucket events, from backward's start."""
    marks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        marks[name + "_start"] = now_s()
        yield
        marks[name + "_end"] = now_s()

    timeline.clear()
    _step(model, (lambda m: sync.finish()) if sync is not None else None, phase, x, y)
    t0 = marks["backward_start"]
    events = sync.take_events() if sync is not None else []
    return {"step_s": marks["optimizer_end"] - marks["forward_start"],
            "backward_s": marks["backward_end"] - t0,
            "wait_s": marks.get("grads_end", t0) - marks.get("grads_start", t0),
            "layers": [(n, s - t0, e - t0) for n, s, e in timeline.spans()],
            "buckets": [(ev.bucket, ev.nbytes, ev.launch_s - t0, ev.finish_s - t0) for ev in events]}


def timing_worker(cfg_dict: dict) -> dict:
    """Run inside ``launch``: :func:`time_variants` on this rank."""
    torch.set_num_threads(1)
    return time_variants(OverlapConfig(**cfg_dict))


def time_variants(cfg: OverlapConfig) -> dict:
    """On every rank of a process group: alpha-beta of the all-reduce, then every variant once per round, rotated,
    each step after a barrier; per variant the rounds' figures (each with its layer and bucket timeline)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = rank_batch(cfg, rank, world)
    fit = fit_allreduce()
    names = variant_names(cfg)
    variants = {n: _make_variant(cfg, n) for n in names}
    hooks = {n: record_layer_backward(variants[n][0]) for n in names}
    bucket_layers = {n: [[_layer_of(variants[n][0], i) for i in b] for b in s.buckets]
                     for n, (_, s) in variants.items() if s is not None}
    for n in names:                                             # warm-up: allocator, connections
        _timed_step(*variants[n], hooks[n][0], x, y)
    rounds: dict[str, list[dict]] = {n: [] for n in names}
    with ShareMeter() as meter:
        for r in range(cfg.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                dist.barrier()
                rounds[n].append(_timed_step(*variants[n], hooks[n][0], x, y))
    for model, sync in variants.values():
        if sync is not None:
            sync.remove()
    for _, handles in hooks.values():
        for h in handles:
            h.remove()
    return {"rank": rank, "world_size": world, "cpu_share": meter.share, "fit": fit, "rounds": rounds,
            "bucket_layers": bucket_layers, "grad_bytes": cfg.grad_bytes}


def _layer_of(model: nn.Module, param_index: int) -> str:
    """The name of the module that owns the ``param_index``-th parameter ('0' for '0.weight')."""
    name = [n for n, p in model.named_parameters() if p.requires_grad][param_index]
    return name.rsplit(".", 1)[0]


def run_overlap_timing(cfg: OverlapConfig, world_size: int = 2, timeout_s: float = 240.0) -> list[dict]:
    """Launch :func:`timing_worker` on ``world_size`` ranks; one result per rank."""
    return launch(timing_worker, world_size, args=(asdict(cfg),), timeout_s=timeout_s, show_output=False,
                  backend="gloo")
