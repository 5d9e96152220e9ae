"""The training-memory model: parameters + gradients + optimizer state + activations saved for backward.

Parameters, gradients and optimizer state do not depend on the batch; the activations autograd saves
for the backward pass grow linearly with it. We *measure* those exactly, on any device, by hooking
every tensor autograd saves (``torch.autograd.graph.saved_tensors_hooks``) and adding up the distinct
storages that are not parameters — then fit ``bytes = per_sample * batch + fixed`` from two small
batches and predict any batch size and dtype. (Sohoni et al. 2019 and Rajbhandari et al. 2020, ZeRO,
break training memory down the same way.)
"""
from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import nn

from labkit.core.choices import OPTIMIZERS
from labkit.core.dtypes import autocast, dtype_bytes, normalise_dtype
from labkit.core.validation import positive_int
from labkit.memory.probe import preserved_state
from labkit.memory.saved import SavedStorages, watch_saved
from labkit.memory.timeline import LayerLine, backward_peak_bytes, fit_layer_lines, forward_peak_bytes, layer_memory
from labkit.memory.workspaces import StepWorkspaces

_STATE_COPIES = {"sgd": 0, "sgd_momentum": 1, "adam": 2}     # fp32 tensors of parameter size kept per optimizer
# parameter-sized temporaries inside optimizer.step(): torch's foreach Adam builds sqrt(v) as a new list of tensors
_STEP_TEMP_COPIES = {"sgd": 0, "sgd_momentum": 0, "adam": 1}


def optimizer_kind(optimizer: str, momentum: float = 0.0) -> str:
    """'sgd' with momentum > 0 is 'sgd_momentum'; validates the name."""
    name = optimizer.lower()
    if name == "sgd" and momentum > 0:
        name = "sgd_momentum"
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS} (or 'sgd' with momentum), got {optimizer!r}")
    return name


def saved_activation_bytes(model: nn.Module, inputs: torch.Tensor, precision: str | None = None) -> int:
    """Exact bytes of the distinct non-parameter storages autograd saves for backward in one forward pass."""
    saved = SavedStorages(exclude=model.parameters())
    with preserved_state(model):
        model.train()
        with watch_saved(saved.on_save), autocast(inputs.device.type, precision):
            out = model(inputs)
        del out
    return saved.total_bytes


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted training memory, in bytes, by part."""

    batch_size: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    # the step's real peak minus the sum of the parts: negative where gradients and activations are never
    # all alive at once, positive for backward gradient buffers and optimizer temporaries (0: not modelled)
    peak_adjust_bytes: int = 0
    # what measured GPU workspaces add to that peak (0: none given, or all fit in the slack where they ran)
    workspace_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Predicted peak of one training step (the parts, the timeline adjustment and any workspace)."""
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.peak_adjust_bytes + self.workspace_bytes)

    def as_dict_mb(self) -> dict:
        """The parts in MB (1e6 bytes), for tables and bar charts."""
        parts = ("params", "grads", "optimizer", "activations", "peak_adjust", "workspace")
        d = {p: getattr(self, f"{p}_bytes") / 1e6 for p in parts}
        d["total"] = self.total_bytes / 1e6
        return d


@dataclass(frozen=True)
class MemoryModel:
    """Training memory as a function of batch size: fixed parts plus activations linear in the batch."""

    param_bytes: int
    param_elements: int
    optimizer: str
    activation_bytes_per_sample: float
    activation_fixed_bytes: float
    activation_dtype: str = "float32"
    param_dtype: str = "float32"
    backward_layers: tuple[LayerLine, ...] = ()     # per-layer lines for the backward-pass peak (empty: sum only)

    def __post_init__(self) -> None:
        optimizer_kind(self.optimizer)
        if self.param_bytes < 0 or self.activation_bytes_per_sample < 0:
            raise ValueError("memory sizes must be >= 0")

    def predict(self, batch_size: int, activation_dtype: str | None = None, param_dtype: str | None = None,
                workspaces: StepWorkspaces | None = None) -> MemoryBreakdown:
        """Predicted bytes at ``batch_size``; dtypes rescale the measured ones (e.g. 'bf16' halves activations).

        ``workspaces`` (GPU, measured at this batch by :func:`labkit.memory.workspaces.measure_workspaces`)
        adds each layer's cuDNN workspace at the moment that layer runs.
        """
        batch_size = positive_int(batch_size, "batch_size")
        act_scale = dtype_bytes(activation_dtype or self.activation_dtype) / dtype_bytes(self.activation_dtype)
        pbytes = self.param_elements * dtype_bytes(param_dtype or self.param_dtype)
        acts = (self.activation_bytes_per_sample * batch_size + self.activation_fixed_bytes) * act_scale
        opt = _STATE_COPIES[self.optimizer] * pbytes
        acts = int(round(acts))
        adjust = extra = 0
        if self.backward_layers:
            layers = [line.at(batch_size, act_scale) for line in self.backward_layers]
            at_optimizer_step = 2 * pbytes + opt + _STEP_TEMP_COPIES[self.optimizer] * pbytes
            peak = max(pbytes + opt + backward_peak_bytes(layers), at_optimizer_step)
            adjust = int(round(peak)) - (2 * pbytes + opt + acts)
            if workspaces is not None:
                ws = self._check_workspaces(workspaces, batch_size).layers
                with_ws = max(pbytes + opt + max(forward_peak_bytes(layers, ws), backward_peak_bytes(layers, ws)),
                              at_optimizer_step)
                extra = int(round(with_ws)) - int(round(peak))
        elif workspaces is not None:
            raise ValueError("this memory model has no per-layer timeline (backward_layers); build it with "
                             "build_memory_model to add workspaces")
        return MemoryBreakdown(batch_size, pbytes, pbytes, opt, acts, adjust, extra)

    def _check_workspaces(self, workspaces: StepWorkspaces, batch_size: int) -> StepWorkspaces:
        if workspaces.batch_size != batch_size:
            raise ValueError(f"these workspaces were measured at batch {workspaces.batch_size}, not {batch_size}: "
                             "cuDNN chooses per batch, so measure them at the batch you predict")
        if len(workspaces.layers) != len(self.backward_layers):
            raise ValueError(f"{len(workspaces.layers)} layer workspaces for a model of {len(self.backward_layers)} "
                             "layer calls: measure them on the same model this memory model was built from")
        return workspaces

    def largest_batch_within(self, budget_bytes: int, safety_margin: float = 0.1, limit: int = 1 << 20) -> int:
        """Largest batch whose predicted total fits in ``budget_bytes * (1 - safety_margin)`` (0 if none)."""
        usable = budget_bytes * (1.0 - safety_margin)
        if self.predict(1).total_bytes > usable:
            return 0
        good, bad = 1, limit + 1                 # the prediction grows with the batch: bisect the boundary
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if self.predict(mid).total_bytes <= usable else (good, mid)
        return good


def build_memory_model(model: nn.Module, sample_shape: tuple[int, ...], optimizer: str = "sgd",
                       momentum: float = 0.9, precision: str | None = None,
                       probe_batches: tuple[int, int] = (2, 4)) -> MemoryModel:
    """Measure saved-activation bytes layer by layer at two small batches and fit the memory model.

    The activations are linear in the batch; the peak comes from replaying the backward pass
    (:mod:`labkit.memory.timeline`) and from the optimizer step's temporaries.
    """
    b1, b2 = probe_batches
    if not (0 < b1 < b2):
        raise ValueError(f"probe_batches must be two increasing positive sizes, got {probe_batches}")
    param = next(model.parameters(), None)
    if param is None:
        raise ValueError("model has no parameters; nothing to train")
    dev = param.device
    with preserved_state(model):
        model.train()
        small = layer_memory(model, torch.randn(b1, *sample_shape, device=dev), autocast(dev.type, precision))
        large = layer_memory(model, torch.randn(b2, *sample_shape, device=dev), autocast(dev.type, precision))
    a1, a2 = sum(x.saved_bytes for x in small), sum(x.saved_bytes for x in large)
    per_sample = (a2 - a1) / (b2 - b1)
    params = [p for p in model.parameters() if p.requires_grad]
    return MemoryModel(param_bytes=sum(p.numel() * p.element_size() for p in params),
                       param_elements=sum(p.numel() for p in params),
                       optimizer=optimizer_kind(optimizer, momentum),
                       activation_bytes_per_sample=per_sample, activation_fixed_bytes=max(0.0, a1 - per_sample * b1),
                       activation_dtype=normalise_dtype(precision),
                       backward_layers=fit_layer_lines(small, large, b1, b2))


def optimizer_settings(optimizer: torch.optim.Optimizer) -> tuple[str, float]:
    """(name, momentum) of a real optimizer, as the memory model needs them: Adam/AdamW -> 'adam', SGD -> 'sgd'."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return "adam", 0.0
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd", float(group.get("momentum", 0.0))
    raise ValueError(f"the memory model knows SGD and Adam/AdamW, not {type(optimizer).__name__}; "
                     "give optimizer_name= for the closest one")
