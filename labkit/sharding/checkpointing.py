"""Activation checkpointing: memory saved vs step time added, predicted and measured.

Checkpointing a segment keeps only its input during forward and recomputes its inside during backward
(Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174). Here a segment is a
child module wrapped in ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, the form PyTorch
recommends. The prediction comes from one plain forward in which every tensor autograd saves is billed to
the segment running at that moment: checkpointed = what is saved outside the checkpointed segments + their
inputs (distinct storages) + the RNG state each checkpoint keeps. The measurement is independent: the bytes
still allocated after the forward (CUDA: ``memory_allocated`` minus the baseline before it; CPU: the profiler's
net allocations).
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

from labkit.core.clock import now_s
from labkit.core.step import TrainStep
from labkit.core.timing import Stopwatch, synchronize
from labkit.core.validation import positive_int
from labkit.core.verdict import relative_spread
from labkit.memory.probe import preserved_state, probe_forward
from labkit.memory.saved import storage_bytes, storage_key, storage_keys, watch_saved


class Checkpointed(nn.Module):
    """Run ``inner`` under non-reentrant activation checkpointing (same parameters, same outputs)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``inner(x)``, its activations recomputed during backward instead of kept."""
        return checkpoint(self.inner, x, use_reentrant=False)


def with_checkpointing(model: nn.Module, segments: Sequence[str]) -> nn.Module:
    """A deep copy of ``model`` with the named child modules checkpointed."""
    names = dict(model.named_children())
    missing = [s for s in segments if s not in names]
    if missing:
        raise ValueError(f"no child module named {missing} to checkpoint; children are {sorted(names)}")
    out = copy.deepcopy(model)
    for name in segments:
        setattr(out, name, Checkpointed(getattr(out, name)))
    return out


def predict_checkpointed_bytes(model: nn.Module, inputs: torch.Tensor, segments: Sequence[str]) -> dict[str, int]:
    """Saved-activation bytes of one forward without and (predicted) with ``segments`` checkpointed.

    Parameters and the input batch are excluded: they exist before the forward and are not activations.
    """
    children = dict(model.named_children())
    param_ptrs = storage_keys([*model.parameters(), inputs])   # the batch exists before the forward: not new memory
    current: list[str | None] = [None]
    saved: dict[int, tuple[int, set]] = {}
    kept_inputs: dict[int, int] = {}

    def enter(name):
        def hook(module, args):
            current[0] = name
            ptr, nbytes = storage_key(args[0]), storage_bytes(args[0])
            kept_inputs[ptr] = nbytes          # a checkpointed segment keeps its input for the recompute
        return hook

    def on_save(t: torch.Tensor) -> None:
        ptr = storage_key(t)
        if ptr and ptr not in param_ptrs:
            saved.setdefault(ptr, (storage_bytes(t), set()))[1].add(current[0])

    handles = [children[s].register_forward_pre_hook(enter(s)) for s in segments]
    handles += [children[s].register_forward_hook(lambda *_: current.__setitem__(0, None)) for s in segments]
    probe_forward(model, inputs, handles, watch_saved(on_save))
    outside = {ptr: n for ptr, (n, segs) in saved.items() if None in segs}   # also saved outside: still kept
    kept = {**outside, **{p: n for p, n in kept_inputs.items() if p not in param_ptrs}}
    rng_bytes = rng_state_bytes(inputs.device) * len(segments)
    return {"plain_bytes": sum(n for n, _ in saved.values()), "checkpointed_bytes": sum(kept.values()) + rng_bytes}


def rng_state_bytes(device: torch.device) -> int:
    """Bytes each checkpoint keeps to replay randomness (``preserve_rng_state``): the CPU generator's state.

    Counted on CPU only: on CUDA that state is a CPU tensor, outside ``memory_allocated``.
    """
    return torch.get_rng_state().numel() if device.type == "cpu" else 0


def measure_forward_retained_bytes(model: nn.Module, inputs: torch.Tensor) -> int:
    """Bytes a training-mode forward leaves allocated, less its output: the activations kept for backward.

    CUDA: ``memory_allocated`` after minus before (other cells' tensors cancel out). CPU: the net of every
    allocation and free the profiler records during the forward.
    """
    with preserved_state(model):
        model.train()
        if inputs.device.type == "cuda":
            synchronize(inputs.device)
            before = torch.cuda.memory_allocated(inputs.device)
            out = model(inputs)
            synchronize(inputs.device)
            retained = torch.cuda.memory_allocated(inputs.device) - before
        else:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                out = model(inputs)
            retained = sum(e.self_cpu_memory_usage for e in prof.key_averages())
        retained -= storage_bytes(out)   # the output is not an activation kept for backward
        del out
    return int(retained)


def square_mean_loss(out: torch.Tensor, _targets: object = None) -> torch.Tensor:
    """A loss for any output shape (no labels): what the memory and timing probes backpropagate."""
    return out.float().square().mean()


def _timed(device: torch.device, fn) -> tuple[float, float]:
    """(device-honest seconds, host launch seconds) of ``fn()``. On a GPU: synchronised wall, and the host's time until
    ``fn`` returned, before the wait (launch ~ wall: the GPU waited for the host, the step is launch-bound). On a CPU
    both are process CPU time (robust to other processes): its kernels finish before the call returns."""
    start = now_s()
    with Stopwatch(device, cpu_time=True) as watch:
        fn()
        launched_s = now_s() - start
    return watch.elapsed_s, (launched_s if device.type == "cuda" else watch.elapsed_s)


def _train_step_time_s(model: nn.Module, inputs: torch.Tensor) -> tuple[float, float]:
    """One forward+backward of the one step (no update): (seconds, host launch seconds), as :func:`_timed` says."""
    step = TrainStep(model, None, loss_fn=square_mean_loss, device=inputs.device)
    return _timed(inputs.device, lambda: step(inputs, None))


@dataclass(frozen=True)
class StepTimeComparison:
    """Median step times with and without checkpointing, measured interleaved, and the host's launch time of each
    (on a GPU, a step whose launch time nears its wall time is launch-bound: the recompute then costs its launches
    and the checkpoint hooks' Python, not its FLOPs). ``ratio_by_round`` and ``share_by_round`` hold each paired
    round's checkpointed/plain step time and forward/plain step time: the price is decided from those pairs, so a
    burst of load that hits one round moves one pair, not one side of the comparison."""

    plain_step_s: float
    checkpointed_step_s: float
    forward_s: float
    plain_launch_s: float = float("nan")
    checkpointed_launch_s: float = float("nan")
    forward_launch_s: float = float("nan")
    ratio_by_round: tuple[float, ...] = ()
    share_by_round: tuple[float, ...] = ()

    @property
    def time_added_fraction(self) -> float:
        """The median round's checkpointed/plain step time, less one (the medians' ratio without rounds)."""
        if self.ratio_by_round:
            return statistics.median(self.ratio_by_round) - 1.0
        return self.checkpointed_step_s / self.plain_step_s - 1.0

    @property
    def predicted_added_fraction(self) -> float:
        """Checkpointing every segment recomputes about one forward pass (Chen et al. 2016, Section 4)."""
        if self.share_by_round:
            return statistics.median(self.share_by_round)
        return self.forward_s / self.plain_step_s

    @property
    def added_and_share_by_round(self) -> tuple[tuple[float, float], ...]:
        """Each paired round's (time added, forward share), the added time floored at 0.1% of a step: what a verdict
        compares round by round (``judge_at_most(..., by_round=...)``)."""
        return tuple((max(ratio - 1.0, 1e-3), share) for ratio, share in zip(self.ratio_by_round, self.share_by_round))

    @property
    def spread(self) -> float:
        """How far the paired rounds' checkpointed/plain ratios disagree ((p90 - p10) / median): the noise of the price."""
        return relative_spread(self.ratio_by_round)

    @property
    def launch_bound_fraction(self) -> float:
        """Host launch time over the step's time: ~1 on a launch-bound GPU step (and always on a CPU)."""
        return self.plain_launch_s / self.plain_step_s


def pace(times: StepTimeComparison, on_gpu: bool) -> str:
    """What set the plain step's pace: 'compute', 'launch' or 'mixed'. On a GPU, from the host's launch time over the
    step's time (above 0.8 the GPU waited for the host's launches; below 0.5 the host waited for the GPU's work). On
    a CPU the kernels run inside their calls: the work sets the pace. A recompute costs a forward's *work* only where
    compute sets the pace (H200: ResNet-18 took 7.9 ms at batch 64 and 8.4 ms at 16, launch-bound, and
    checkpointing added 133-137% there against a 40-50% forward share; at batch 1024, 27% against 30%)."""
    if not on_gpu:
        return "compute"
    ratio = times.launch_bound_fraction
    return "launch" if ratio > 0.8 else "compute" if ratio < 0.5 else "mixed"


def compare_step_time(plain: nn.Module, checkpointed: nn.Module, inputs: torch.Tensor,
                      repeats: int = 5) -> StepTimeComparison:
    """Interleave plain and checkpointed steps (so load hits both alike), pair them round by round and take medians;
    also time a forward in each round (its share of the plain step is the predicted price)."""
    repeats = positive_int(repeats, "repeats")
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # CPU time of one thread: idle spinning of a thread pool would blur it
    with preserved_state(plain), preserved_state(checkpointed):
        for _ in range(repeats + 1):                  # the first round warms up and is dropped
            rows.append((*_train_step_time_s(plain, inputs), *_train_step_time_s(checkpointed, inputs),
                         *_timed(inputs.device, lambda: plain(inputs))))   # with autograd on: what recompute costs
    torch.set_num_threads(threads)
    rows = rows[1:]
    plain_s, plain_launch, ckpt_s, ckpt_launch, fwd_s, fwd_launch = (statistics.median(c) for c in zip(*rows))
    return StepTimeComparison(plain_s, ckpt_s, fwd_s, plain_launch, ckpt_launch, fwd_launch,
                              ratio_by_round=tuple(r[2] / r[0] for r in rows),
                              share_by_round=tuple(r[4] / r[0] for r in rows))


def bytes_line(bytes_at: dict[int, int]) -> tuple[float, float]:
    """(bytes per sample, fixed bytes) of the line through the two smallest measured batches."""
    (b1, a1), (b2, a2) = sorted(bytes_at.items())[:2]
    per_sample = (a2 - a1) / (b2 - b1)
    if per_sample <= 0:
        raise ValueError(f"activation bytes did not grow with the batch ({bytes_at}); measure larger batches")
    return per_sample, a1 - per_sample * b1


def largest_batch_within(bytes_at: dict[int, int], budget_bytes: int, fixed_bytes: int = 0) -> int:
    """Largest batch whose activations (linear fit through two measured batches) + ``fixed_bytes`` fit the budget."""
    per_sample, intercept = bytes_line(bytes_at)
    return max(0, int((budget_bytes - fixed_bytes - intercept) // per_sample))


def transformer_stack(d_model: int = 64, heads: int = 4, layers: int = 4, seed: int = 0) -> nn.Sequential:
    """Pre-norm transformer encoder blocks (batch_first), each a child module that can be checkpointed."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                                      norm_first=True) for _ in range(layers)])
