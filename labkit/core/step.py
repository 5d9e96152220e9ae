"""One training step, the only one in the kit: copy the batch to the device, forward under autocast, backward
(loss-scaled for fp16), an optional gradient hook, the optimizer's update, gradients cleared.

Every option the notebooks teach is a field of :class:`StepOptions`: autocast dtype (Micikevicius et al. 2018,
"Mixed Precision Training", with a ``GradScaler`` for fp16), channels-last inputs, a compiled model
(:func:`prepare_model`), gradient accumulation over micro-batches (Goyal et al. 2017, section 2: the mean of the
micro-batch gradients is the big batch's gradient) and ``set_to_none``. A DDP model or a ZeRO/FSDP wrapper is
passed in as the model or the optimizer: the step only calls ``model(x)``, ``optimizer.step()`` and
``optimizer.zero_grad(set_to_none=...)`` (and ``model.no_sync()`` between accumulated micro-batches, where the
wrapper has one). A ``grad_hook`` runs between backward and the update: from-scratch synchronous SGD averages the
gradients there. The loop, the profiler, the batch-size finder, the memory checks, the FLOP counter and the
parallel and sharding labs all run this step; what differs between them is what they wrap around its phases
(``phase(name)`` is entered around "h2d", "forward", "backward", "grads" and "optimizer"): marks of a clock,
profiler labels, a memory count.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, NamedTuple

import torch
from torch import nn

from labkit.core.dtypes import amp_mode, autocast
from labkit.core.validation import positive_int

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Phase = Callable[[str], ContextManager]
PHASES = ("h2d", "forward", "backward", "grads", "optimizer")


@dataclass(frozen=True)
class StepOptions:
    """How a step runs: autocast dtype, input memory format, compilation, micro-batches per update, grad clearing."""

    precision: str | None = None        # None (fp32) or an autocast dtype: 'bf16', 'fp16' (fp16 adds a GradScaler)
    channels_last: bool = False         # 4-D inputs (and the model, in prepare_model) in NHWC memory format
    compile: bool = False               # prepare_model wraps the model in torch.compile
    accumulation_steps: int = 1         # micro-batches per optimizer update (the batch is split into this many)
    set_to_none: bool = True            # clear gradients by freeing them (True) or by zeroing them in place

    def __post_init__(self) -> None:
        # every spelling of the one precision table ('bfloat16', torch.bfloat16, ...) is stored as 'bf16'/'fp16'
        object.__setattr__(self, "precision", amp_mode(self.precision))
        positive_int(self.accumulation_steps, "accumulation_steps")


class StepResult(NamedTuple):
    """What one step leaves: its loss (detached, still on the device), its samples and the inputs as the model saw
    them (on the device, in its memory format)."""

    loss: torch.Tensor
    samples: int
    inputs: torch.Tensor


def prepare_model(model: nn.Module, options: StepOptions, device: torch.device) -> nn.Module:
    """The model on ``device``, channels-last and compiled as ``options`` say (fp16 refused off CUDA)."""
    model.to(device)
    if options.channels_last:
        model.to(memory_format=torch.channels_last)
    if options.precision == "fp16" and device.type != "cuda":
        raise ValueError("precision='fp16' needs a CUDA GPU (it uses a GradScaler); use precision='bf16' on CPU")
    if options.compile:
        try:
            return torch.compile(model)
        except Exception as err:  # noqa: BLE001
            raise RuntimeError(f"torch.compile is not usable here ({type(err).__name__}: {err}); "
                               "set compile=False") from None
    return model


# torch's words for a layer that got an input of the wrong size (a wrong image shape, usually)
INPUT_SHAPE_ERRORS = ("shapes cannot be multiplied", "channels, but got", "Kernel size can't be greater",
                      "Output size is too small", "(unbatched) or", "must match the size of tensor", "should contain",
                      "size mismatch")
RESHAPE_ERRORS = ("is invalid for input of size",)    # a view/reshape inside the model: its own sizes, or the data


def first_forward_hint(model_name: str, batch_shape: tuple, err: RuntimeError) -> str | None:
    """The one-line advice for an error in a model's first forward, or None when it is no shape mismatch (a dtype
    or device mismatch, a bug in the model): only a shape error gets the image-shape hint."""
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    if any(words in first for words in INPUT_SHAPE_ERRORS):
        return (f"{model_name} does not accept batches of shape {batch_shape}: {first}. Build the model for this "
                "data's image shape (see labkit.core.models.build_model)")
    if any(words in first for words in RESHAPE_ERRORS):
        return (f"{model_name}: a reshape inside the model failed on a batch of shape {batch_shape}: {first}. Check "
                "the model's own sizes against each other (heads that split evenly over the tensor-parallel ranks, "
                "a flatten width) and against the data")
    return None


def _no_phase(name: str) -> ContextManager:
    return contextlib.nullcontext()


def _device_of(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


class TrainStep:
    """``step(x, y)`` runs one training step of ``model`` with ``optimizer`` (None: forward and backward only, the
    gradients then cleared) and returns a :class:`StepResult`; the model's first call is checked for clear errors."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 loss_fn: LossFn = nn.functional.cross_entropy, options: StepOptions = StepOptions(),
                 device: torch.device | None = None, grad_hook: Callable[[nn.Module], None] | None = None) -> None:
        self.model, self.optimizer, self.loss_fn, self.options = model, optimizer, loss_fn, options
        self.device = device if device is not None else _device_of(model)
        self.grad_hook = grad_hook
        self.scaler = torch.amp.GradScaler(self.device.type) if options.precision == "fp16" else None
        self._checked = False

    def __call__(self, x: torch.Tensor, y: torch.Tensor, phase: Phase | None = None) -> StepResult:
        """One step on the batch (``x``, ``y``); ``phase(name)`` wraps each phase (see the module docstring)."""
        phase = phase or _no_phase
        with phase("h2d"):
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True) if isinstance(y, torch.Tensor) else y
            if self.options.channels_last and x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)
        loss = self._forward_backward(x, y, phase)
        if self.grad_hook is not None:
            with phase("grads"):
                self.grad_hook(self.model)
        with phase("optimizer"):
            self._update()
        return StepResult(loss, int(x.shape[0]), x)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor, phase: Phase) -> torch.Tensor:
        """Forward and backward over the micro-batches (one unless accumulating); the mean loss, detached."""
        k = self.options.accumulation_steps
        if k == 1:
            return self._one(x, y, phase, 1, contextlib.nullcontext())
        if x.shape[0] % k:
            raise ValueError(f"a batch of {x.shape[0]} does not split into accumulation_steps={k} equal micro-batches")
        total = None
        for i, (xi, yi) in enumerate(zip(x.chunk(k), y.chunk(k))):
            last = i == k - 1
            no_sync = self.model.no_sync() if hasattr(self.model, "no_sync") and not last else contextlib.nullcontext()
            loss = self._one(xi, yi, phase, k, no_sync)
            total = loss if total is None else total + loss
        return total

    def _one(self, x: torch.Tensor, y: torch.Tensor, phase: Phase, k: int, context: ContextManager) -> torch.Tensor:
        with context:
            with phase("forward"):
                loss = self._loss(x, y)
                if k > 1:
                    loss = loss / k                     # the mean over micro-batches is the big batch's mean
            with phase("backward"):
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss.detach()

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast(self.device.type, self.options.precision):
            if self._checked:
                return self.loss_fn(self.model(x), y)
            try:
                out = self.model(x)
            except torch.cuda.OutOfMemoryError:
                raise                                   # the batch-size finder's answer, not a shape error
            except RuntimeError as err:
                hint = first_forward_hint(type(self.model).__name__, tuple(x.shape), err)
                if hint is None:
                    raise                                 # a dtype or device mismatch says so itself: no guess
                raise ValueError(hint) from None
            if self.loss_fn is nn.functional.cross_entropy and (out.ndim != 2 or out.shape[0] != x.shape[0]):
                raise ValueError(f"model output has shape {tuple(out.shape)}; expected (batch, classes)")
            self._checked = True
            return self.loss_fn(out, y)

    def _update(self) -> None:
        set_to_none = self.options.set_to_none
        if self.optimizer is None:
            self.model.zero_grad(set_to_none=set_to_none)
        elif self.scaler is not None:
            self.scaler.step(self.optimizer)            # unscales in fp32; skips the update if it finds inf/NaN
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=set_to_none)
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=set_to_none)
