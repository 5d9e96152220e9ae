"""Model parallelism: split a model by layers across devices, measure what each holds, and choose.

Naive splitting leaves every stage but one idle at any moment; ``labkit.parallel.pipeline.gpipe`` pipelines it
(GPipe, Huang et al. 2019). ``recommend_parallelism`` is the rule of notebook 05: split the model only when
its training state does not fit one device; otherwise replicate it when the all-reduce costs less than the
compute it parallelises (``labkit.parallel.data.costmodel``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from labkit.core.models import mlp_layers
from labkit.core.validation import positive_int
from labkit.parallel.data.costmodel import pays_off, predicted_speedup
from labkit.parallel.pipeline.schedule_sim import micro_batches_for_bubble


# ---------------------------------------------------------------------------- the model and its split
@dataclass(frozen=True)
class SplitConfig:
    """An MLP of ``stages * layers_per_stage`` hidden layers, cut into equal stages."""

    in_features: int = 1024
    hidden: int = 1024
    layers_per_stage: int = 2
    num_classes: int = 10
    stages: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("in_features", "hidden", "layers_per_stage", "num_classes", "stages"):
            positive_int(getattr(self, name), name)


def build_stages(cfg: SplitConfig) -> list[nn.Sequential]:
    """The model as a list of stages (same weights for the same seed, however it is split)."""
    torch.manual_seed(cfg.seed)
    hidden_layers = cfg.stages * cfg.layers_per_stage
    layers = mlp_layers((cfg.in_features, *[cfg.hidden] * hidden_layers, cfg.num_classes))   # [Linear, ReLU] * n, Linear
    per_stage = 2 * cfg.layers_per_stage
    stages = [layers[s * per_stage:(s + 1) * per_stage] for s in range(cfg.stages)]
    stages[-1].append(layers[-1])                      # the classifier closes the last stage
    return [nn.Sequential(*stage) for stage in stages]


def stage_devices(stages: int = 2) -> tuple[list[torch.device], str]:
    """One GPU per stage when there are enough GPUs, else every stage on the CPU; and a sentence saying which."""
    if torch.cuda.device_count() >= stages:
        return [torch.device("cuda", i) for i in range(stages)], f"{stages} GPUs, one stage each"
    return [torch.device("cpu")] * stages, (f"only {torch.cuda.device_count()} GPU(s): an explicit split on one "
                                            "device (the CPU); the pipeline timings use two CPU processes")


class SplitModel(nn.Module):
    """Naive model parallelism: stage i lives on devices[i]; activations hop device to device."""

    def __init__(self, stages: list[nn.Module], devices: list[torch.device]) -> None:
        super().__init__()
        if len(stages) != len(devices):
            raise ValueError(f"need one device per stage: {len(stages)} stages, {len(devices)} devices")
        self.stages = nn.ModuleList(s.to(d) for s, d in zip(stages, devices))
        self.devices = list(devices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Each stage on its own device, the activations moved in between."""
        for stage, device in zip(self.stages, self.devices):
            x = stage(x.to(device))
        return x


def training_state_bytes(module: nn.Module, momentum: bool = True) -> int:
    """Bytes of parameters + gradients (+ one momentum buffer) that training keeps on the module's device."""
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    return param_bytes * (3 if momentum else 2)


def memory_per_stage(stages: list[nn.Module]) -> dict[str, object]:
    """Training-state bytes per stage, for the whole model, and the largest stage's share of the whole."""
    per_stage = [training_state_bytes(s) for s in stages]
    whole = sum(per_stage)
    return {"per_stage_bytes": per_stage, "whole_bytes": whole, "max_share": max(per_stage) / whole}


@dataclass(frozen=True)
class Recommendation:
    """Which parallelism to use and the numbers behind it."""

    choice: str            # "data parallel" | "model parallel (pipeline)" | "one device"
    reason: str


def recommend_parallelism(model_state_bytes: int, device_memory_bytes: int, t_comp_s: float, t_sync_s: float,
                          world_size: int, max_bubble: float = 0.2) -> Recommendation:
    """The rule: split the model only when it does not fit; otherwise replicate it when T_sync < (R-1) T_comp."""
    model_state_bytes = positive_int(model_state_bytes, "model_state_bytes")
    device_memory_bytes = positive_int(device_memory_bytes, "device_memory_bytes")
    world_size = positive_int(world_size, "world_size")
    if model_state_bytes > device_memory_bytes:
        p = -(-model_state_bytes // device_memory_bytes)            # ceil: stages needed to fit
        m = micro_batches_for_bubble(p, max_bubble)
        return Recommendation("model parallel (pipeline)",
                              f"training state {model_state_bytes / 2**20:.1f} MiB > device "
                              f"{device_memory_bytes / 2**20:.1f} MiB: split into >= {p} stages and use >= {m} "
                              f"micro-batches to keep the bubble <= {100 * max_bubble:.0f}%")
    sync_ms, spare_ms = 1e3 * t_sync_s, 1e3 * (world_size - 1) * t_comp_s      # T_sync vs T_comp
    if world_size > 1 and pays_off(t_comp_s, t_sync_s, world_size):
        speedup = predicted_speedup(t_comp_s, t_sync_s, world_size)
        return Recommendation("data parallel", f"the model fits; T_sync {sync_ms:.2f} ms < (R-1) T_comp "
                                               f"{spare_ms:.2f} ms -> predicted speedup {speedup:.2f}x on "
                                               f"{world_size} replicas")
    return Recommendation("one device", f"the model fits and T_sync {sync_ms:.2f} ms >= (R-1) T_comp "
                                        f"{spare_ms:.2f} ms: more replicas would not pay")
