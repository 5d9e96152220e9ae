"""The largest batch that fits: doubling, then binary search, with every trial reported.

On a GPU the finder tries real training steps and catches ``torch.cuda.OutOfMemoryError``; on a CPU it
asks the memory model (:mod:`labkit.memory.model`) against a budget you give. Either way it reports every
trial with its throughput, so you can see that the largest batch is not always the fastest, and it
restores the model's and optimizer's state afterwards.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Callable

import pandas as pd
import torch
from torch import nn

from labkit.core.device import device_label, get_device
from labkit.core.models import check_model_accepts
from labkit.core.step import TrainStep
from labkit.core.timing import synchronize, time_fn
from labkit.core.validation import checked_int, positive_int, positive_number
from labkit.memory.device import baseline_bytes, peak_since
from labkit.memory.host import release_cpu_memory
from labkit.memory.model import MemoryModel, build_memory_model, optimizer_kind, optimizer_settings
from labkit.training.run_spec import RunSpec


@dataclass(frozen=True)
class Trial:
    """One tried batch size: did it fit, and how fast did it train."""

    batch_size: int
    fits: bool
    samples_per_s: float | None
    peak_mem_bytes: int | None
    note: str = ""


@dataclass
class FinderResult:
    """The largest batch that fits within ``usable_bytes`` and every trial on the way."""

    max_batch: int
    trials: list[Trial]
    method: str                 # "cuda-oom" (real steps) or "memory-model" (CPU budget)
    usable_bytes: int | None
    device: str
    stopped_by: str = "memory"  # "memory" (the next size up failed), "limit" or "dataset" (nothing failed)
    dataset_size: int | None = None

    @property
    def boundary_confirmed(self) -> bool:
        """True when ``max_batch`` fitted and ``max_batch + 1`` was tried and did not."""
        fits = {t.batch_size: t.fits for t in self.trials}
        return fits.get(self.max_batch) is True and fits.get(self.max_batch + 1) is False

    def summary(self) -> str:
        """One truthful line: never 'at least N' beyond the data, never a boundary that was not found."""
        if self.stopped_by == "dataset":
            return (f"all {self.dataset_size} samples of the dataset fit in one batch; memory is not the limit "
                    f"here (method {self.method}, {self.device})")
        if self.stopped_by == "limit":
            return (f"at least {self.max_batch} fits: the search stopped at its limit before running out of "
                    f"memory (method {self.method}, {self.device})")
        return (f"largest batch that fits: {self.max_batch}; {self.max_batch + 1} does not "
                f"(method {self.method}, {self.device})")

    def to_dataframe(self) -> pd.DataFrame:
        """Trials as a pandas DataFrame."""
        return pd.DataFrame([asdict(t) for t in self.trials])


def search_largest(fits: Callable[[int], bool], start: int = 1, limit: int = 4096) -> int:
    """Largest n in [start, limit] with fits(n), assuming fits is monotone: doubling, then binary search."""
    start = positive_int(start, "start")
    limit = checked_int(limit, "limit", minimum=start, hint=f"the search runs from start={start} up to limit")
    if not fits(start):
        return 0
    return _bisect(fits, *_double_until_failure(fits, start, limit))


def _double_until_failure(fits: Callable[[int], bool], good: int, limit: int) -> tuple[int, int | None]:
    """From a size that fits, double until one does not (or the limit); returns (fits, fails or None)."""
    while good < limit:
        nxt = min(good * 2, limit)
        if not fits(nxt):
            return good, nxt
        good = nxt
    return good, None


def _bisect(fits: Callable[[int], bool], good: int, bad: int | None) -> int:
    """Narrow (fits, fails) to neighbours; with no failing size the fitting one is the answer."""
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def search_from_hint(fits: Callable[[int], bool], hint: int, limit: int) -> int:
    """Largest n <= limit with fits(n), starting at a predicted ``hint``: confirm it, then walk to the boundary.

    Doubles up from the hint if it fits, halves down if it does not, then bisects, so the answer is
    always a size that ran next to one that failed (unless the limit or size 1 ends the search).
    """
    hint = max(1, min(hint, limit))
    if fits(hint):
        return _bisect(fits, *_double_until_failure(fits, hint, limit))
    bad = hint
    while bad > 1:
        good = bad // 2
        if fits(good):
            return _bisect(fits, good, bad)
        bad = good
    return 0


class _StepRunner:
    """Runs real training steps at a given batch; turns an out-of-memory error into a result, not a crash."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, sample_shape, num_classes, device):
        self.model, self.optimizer, self.shape = model, optimizer, tuple(sample_shape)
        self.num_classes, self.device = num_classes, device
        self.train_step = TrainStep(model, optimizer, device=device)

    def step(self, batch_size: int) -> None:
        x = torch.randn(batch_size, *self.shape, device=self.device)
        y = torch.randint(0, self.num_classes, (batch_size,), device=self.device)
        self.train_step(x, y)

    def try_step(self, batch_size: int) -> tuple[bool, int | None]:
        """(ran without OOM, the step's peak allocated bytes on CUDA, other code's tensors subtracted)."""
        cuda = self.device.type == "cuda"
        baseline = 0
        if cuda:
            synchronize(self.device)
            baseline = baseline_bytes(self.device, self.model, self.optimizer)
            torch.cuda.reset_peak_memory_stats(self.device)
        ok = True
        try:
            self.step(batch_size)
            synchronize(self.device)
        except torch.cuda.OutOfMemoryError:
            ok = False          # the exception (and the frames holding big tensors) is dropped here
        if not ok:
            self.free()
            return False, None
        return True, peak_since(self.device, baseline)[0] if cuda else None

    def free(self) -> None:
        """Release everything a failed step left behind so the process stays usable."""
        self.optimizer.zero_grad(set_to_none=True)
        release_cpu_memory()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def throughput(self, batch_size: int, steps: int) -> float:
        res = time_fn(lambda: self.step(batch_size), warmup=1, repeats=steps, device=self.device)
        return batch_size / res.median_s


SEARCH_CAP = 1 << 24        # no real GPU fits this many 32x32 images; keeps a broken OOM signal from looping forever


def find_max_batch(model: nn.Module, sample_shape: tuple[int, ...], *, num_classes: int = 10,
                   optimizer: torch.optim.Optimizer | None = None, optimizer_name: str = "sgd",
                   momentum: float = 0.9, device: str | torch.device | None = None,
                   memory_budget_bytes: int | None = None, safety_margin: float = 0.1, start: int = 1,
                   limit: int | None = None, dataset_size: int | None = None, timing_steps: int = 2,
                   method: str = "auto", memory_model: MemoryModel | None = None,
                   run: RunSpec | None = None) -> FinderResult:
    """Largest batch that trains within memory (minus ``safety_margin``); every trial reported with samples/s.

    ``method``: "auto" (real steps + OOM on CUDA, memory model on CPU), "oom" or "memory-model". With no
    ``limit`` the search runs until a size fails, so on an 80 GB GPU it still ends at a real boundary;
    on CUDA it starts from the memory model's prediction and confirms it. ``dataset_size`` caps the
    search: a batch larger than the data is never claimed. ``memory_model``: one already built for this
    model and optimizer (:func:`labkit.memory.model.build_memory_model`), instead of probing it again. ``run``: the
    run's description (:class:`labkit.training.run_spec.RunSpec`), whose optimizer and momentum then apply.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}; pass the model itself")
    dev = get_device(device) if device is not None else next(model.parameters()).device
    run = run or RunSpec(optimizer=optimizer_name, momentum=momentum, lr=1e-3)   # one way to name an optimizer
    method, budget_bytes = _checked_method(method, dev, memory_budget_bytes, safety_margin)
    start, timing_steps = positive_int(start, "start"), checked_int(timing_steps, "timing_steps", minimum=0)
    cap = min(checked_int(limit, "limit", allow_none=True) or SEARCH_CAP,
              checked_int(dataset_size, "dataset_size", allow_none=True) or SEARCH_CAP)
    _check_boundary(model, sample_shape, num_classes, start, cap)
    usable = None if budget_bytes is None else int(budget_bytes * (1 - safety_margin))
    model.to(dev)
    opt = optimizer or run.build_optimizer(model)
    opt_name, opt_momentum = optimizer_settings(opt)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    runner, trials = _StepRunner(model, opt, sample_shape, num_classes, dev), []
    mem_model = _budget_model(model, sample_shape, opt_name, opt_momentum, usable, budget_bytes,
                              safety_margin, method, memory_model)
    fits = _trial_fn(runner, mem_model if method == "memory-model" else None, usable, safety_margin,
                     timing_steps, trials)
    try:
        if method == "oom" and mem_model is not None and start == 1:
            best = search_from_hint(fits, mem_model.largest_batch_within(usable, 0.0, cap), cap)
        else:
            best = search_largest(fits, min(start, cap), cap)
    finally:
        runner.free()
        model.load_state_dict(saved_model)
        opt.load_state_dict(saved_opt)
    return FinderResult(best, trials, "cuda-oom" if method == "oom" else "memory-model", usable, device_label(dev),
                        _stopped_by(trials, best, cap, dataset_size), dataset_size)


def _check_boundary(model: nn.Module, sample_shape: tuple[int, ...], num_classes: int, start: int, cap: int) -> None:
    """One ValueError before any trial: a sample shape the model cannot take, or a start above the search's cap."""
    shape = tuple(sample_shape) if isinstance(sample_shape, (tuple, list, torch.Size)) else None
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ValueError(f"sample_shape must be one sample's shape without the batch dimension, e.g. (3, 32, 32); "
                         f"got {sample_shape!r}")
    check_model_accepts(model, shape, positive_int(num_classes, "num_classes"))
    if start > cap:
        raise ValueError(f"start={start} is above the largest batch the search may try ({cap}: limit or "
                         f"dataset_size); give a start <= {cap}, or raise limit")


def _checked_method(method: str, dev: torch.device, budget_bytes: int | None,
                    safety_margin: float) -> tuple[str, int | None]:
    """('oom' or 'memory-model', the memory budget): 'auto' resolved for the device, a GPU's budget its memory."""
    if not 0 <= safety_margin < 1:
        raise ValueError(f"safety_margin must be in [0, 1), e.g. 0.1 for 10%, got {safety_margin}")
    method = ("oom" if dev.type == "cuda" else "memory-model") if method == "auto" else method
    if method not in ("oom", "memory-model"):
        raise ValueError(f"method must be 'auto', 'oom' or 'memory-model', got {method!r}")
    if budget_bytes is not None:        # a zero or negative budget is a typo: say so, not 'leaves -0.000 MB'
        positive_number(budget_bytes, "memory_budget_bytes", hint="bytes, e.g. 2 * 1024**3")
    if method == "memory-model" and budget_bytes is None:
        raise ValueError("on a CPU give memory_budget_bytes= (e.g. 2 * 1024**3); the finder checks the memory "
                         "model against it")
    if dev.type == "cuda" and budget_bytes is None:
        budget_bytes = torch.cuda.get_device_properties(dev).total_memory
    return method, budget_bytes


def _stopped_by(trials: list[Trial], best: int, cap: int, dataset_size: int | None) -> str:
    """Why the search ended: 'memory' (a larger size failed), 'dataset' or 'limit' (nothing failed)."""
    if best == 0 or any(not t.fits and t.batch_size > best for t in trials):
        return "memory"
    return "dataset" if dataset_size and cap == dataset_size else "limit"


def _budget_model(model, sample_shape, opt_name, momentum, usable, budget_bytes, safety_margin, method, given):
    """The memory model for the run's optimizer (``given``, or built); refuses a budget below the fixed parts."""
    if usable is None:
        return None
    if given is not None:
        _check_given_model(given, model, optimizer_kind(opt_name, momentum))
    mem_model = given if given is not None else build_memory_model(model, sample_shape, opt_name, momentum)
    fixed = 2 * mem_model.param_bytes + mem_model.predict(1).optimizer_bytes
    if method == "memory-model" and fixed > usable:
        raise ValueError(f"memory_budget_bytes={budget_bytes} leaves {usable / 1e6:.3f} MB after the "
                         f"{safety_margin:.0%} margin, less than the parameters, gradients and optimizer state "
                         f"alone ({fixed / 1e6:.3f} MB); give a larger budget")
    return mem_model


def _check_given_model(memory_model: MemoryModel, model: nn.Module, optimizer: str) -> None:
    """Refuse a memory model built for another model (parameter count) or another optimizer."""
    elements = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if memory_model.param_elements != elements:
        raise ValueError(f"memory_model counts {memory_model.param_elements} parameters, the model has {elements}; "
                         "build it from the model you give the finder")
    if memory_model.optimizer != optimizer:
        raise ValueError(f"memory_model was built for optimizer {memory_model.optimizer!r}, but the finder trains "
                         f"with {optimizer!r}; build it with the finder's optimizer")


def _trial_fn(runner, mem_model, usable, safety_margin, timing_steps, trials) -> Callable[[int], bool]:
    """fits(batch): a predicted or real trial, recorded in ``trials`` with its throughput."""
    def fits(bs: int) -> bool:
        if mem_model is not None:
            peak = mem_model.predict(bs).total_bytes
            ok, note = peak <= usable, "predicted by the memory model"
        else:
            ok, peak = runner.try_step(bs)
            note = "ran" if ok else "out of memory"
            if ok and usable is not None and peak is not None and peak > usable:
                ok, note = False, f"ran, but above the {safety_margin:.0%} safety margin"
        rate = runner.throughput(bs, timing_steps) if ok and timing_steps > 0 else None
        trials.append(Trial(bs, ok, rate, peak, note))
        return ok
    return fits
