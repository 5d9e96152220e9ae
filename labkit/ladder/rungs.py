"""The rungs of the tuning ladder: what each one switches on, and whether this machine can use it.

Rungs are cumulative recipes (:class:`Recipe`). :func:`propose` switches one rung on top of the best recipe so
far, or says why it does not apply here (TF32 on a CPU, DDP with one device, torch.compile without a compiler),
so no rung is ever dropped silently. What this machine offers is probed in :mod:`labkit.ladder.capabilities`;
how a recipe is trained and measured lives in :mod:`labkit.ladder.measure`. Torch-free: the CLI's parser offers
the rung names without loading torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

RUNG_KEYS = ("naive", "batch_size", "input_pipeline", "device_data", "no_sync", "tf32", "mixed_precision",
             "channels_last", "compile", "ddp")


@dataclass(frozen=True)
class Recipe:
    """The cumulative training recipe one rung measures (``batch_size`` is per process)."""

    batch_size: int = 1
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    device_data: bool = False            # whole dataset pre-processed once and held on the device
    sync_every_step: bool = True
    tf32: bool = False                   # False = strict IEEE fp32 convolutions and matmuls
    precision: str | None = None
    channels_last: bool = False
    compile: bool = False
    world_size: int = 1

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size


@dataclass(frozen=True)
class RungSpec:
    """A rung: what it switches on, two lines on why, and the notebook that taught it."""

    index: int
    key: str
    title: str
    explanation: str
    notebook: str


RUNGS = (
    RungSpec(0, "naive", "naive recipe",
             "Batch 1, strict fp32, data loaded in the training process, the loss read with .item() every step.\n"
             "The recipe of many first scripts; every later rung is measured (speed and accuracy) against it.",
             "02_batch_size.ipynb"),
    RungSpec(1, "batch_size", "good batch size",
             "A batch that fits (the finder) and is fastest in a short probe; LR scaled linearly, with warm-up.\n"
             "Per-step overheads are paid once per batch instead of once per sample (Goyal et al. 2017).",
             "02_batch_size.ipynb"),
    RungSpec(2, "input_pipeline", "input pipeline",
             "DataLoader workers, pinned memory, prefetching and persistent workers.\n"
             "Batches are prepared while the model computes; helps when loading is slow, costs cores when not.",
             "04_input_pipelines.ipynb"),
    RungSpec(3, "device_data", "data on the device",
             "The whole (small) dataset normalised once and kept on the device; batches are index lookups there.\n"
             "No per-sample Python, no worker processes, no host-to-device copy per step.",
             "04_input_pipelines.ipynb"),
    RungSpec(4, "no_sync", "no per-step sync",
             "No per-step loss.item() and no phase timers: the host never waits for the device mid-run.\n"
             "On a GPU the host queues the next step while the current one runs; on a CPU there is little to win.",
             "03_profiling.ipynb"),
    RungSpec(5, "tf32", "TF32 math",
             "fp32 convolutions and matmuls on tensor cores in TF32 (10-bit mantissa, fp32 range and accumulation).\n"
             "Rungs before this one run strict IEEE fp32; NVIDIA Ampere and later GPUs only.",
             "10_tuning_ladder.ipynb"),
    RungSpec(6, "mixed_precision", "mixed precision",
             "Autocast to bf16 (or fp16 with a GradScaler where bf16 is missing), master weights in fp32.\n"
             "Tensor cores run 16-bit math much faster (Micikevicius et al. 2018); CPUs often do not.",
             "08_tensorflow_distribution.ipynb"),
    RungSpec(7, "channels_last", "channels_last",
             "Model weights and inputs in NHWC memory order.\n"
             "Convolution kernels for tensor cores (and oneDNN) prefer NHWC; others convert back and forth.",
             "03_profiling.ipynb"),
    RungSpec(8, "compile", "torch.compile",
             "TorchDynamo captures the model, Inductor fuses its operations into generated kernels.\n"
             "Fewer, fused kernels; a one-off compile time, reported separately (Ansel et al. 2024).",
             "03_profiling.ipynb"),
    RungSpec(9, "ddp", "DDP, all local devices",
             "One process per device (NCCL, one GPU per rank; gloo processes on a CPU); gradients all-reduced.\n"
             "Global batch and LR scale with the number of processes (Goyal et al. 2017; Li et al. 2020).",
             "07_synchronous_sgd.ipynb"),
)


@dataclass(frozen=True)
class Capabilities:
    """What this machine offers the ladder, with the reason for each 'no'."""

    device_type: str
    cpu_cores: int
    precision: str
    compile_ok: bool
    compile_reason: str
    ddp_world_size: int
    ddp_reason: str
    num_workers: int
    tf32_ok: bool = False
    tf32_reason: str = "TF32 is a tensor-core format of NVIDIA GPUs (Ampere and later); a CPU computes fp32 exactly"


def propose(key: str, recipe: Recipe, caps: Capabilities, batch_size: int) -> tuple[Recipe | None, str]:
    """(the recipe with rung ``key`` switched on, what changed) or (None, why it does not apply here)."""
    replace = dataclasses.replace
    if key == "naive":
        return Recipe(), "batch 1, strict fp32, no workers, .item() every step"
    if key == "batch_size":
        return replace(recipe, batch_size=batch_size), f"batch {recipe.batch_size} -> {batch_size}"
    if key == "input_pipeline":
        pin = caps.device_type == "cuda"
        return (replace(recipe, num_workers=caps.num_workers, pin_memory=pin, prefetch_factor=4,
                        persistent_workers=True),
                f"{caps.num_workers} worker(s), prefetch 4, persistent, pinned memory {'on' if pin else 'n/a on CPU'}")
    if key == "device_data":
        return (replace(recipe, device_data=True, num_workers=0, pin_memory=False, prefetch_factor=None,
                        persistent_workers=False), f"dataset held on the {caps.device_type}, no DataLoader")
    if key == "no_sync":
        return replace(recipe, sync_every_step=False), "no per-step .item() / device sync"
    if key == "tf32":
        return (replace(recipe, tf32=True), "fp32 convolutions/matmuls in TF32") if caps.tf32_ok \
            else (None, caps.tf32_reason)
    if key == "mixed_precision":
        return replace(recipe, precision=caps.precision), \
            f"autocast {caps.precision}" + (" + GradScaler" if caps.precision == "fp16" else "")
    if key == "channels_last":
        return replace(recipe, channels_last=True), "NHWC memory format"
    if key == "compile":
        return (replace(recipe, compile=True), "torch.compile (Inductor)") if caps.compile_ok \
            else (None, caps.compile_reason)
    if key == "ddp":
        if caps.ddp_world_size < 2:
            return None, caps.ddp_reason
        return (replace(recipe, world_size=caps.ddp_world_size),
                f"{caps.ddp_world_size} processes, global batch {recipe.batch_size * caps.ddp_world_size}, LR scaled "
                f"({caps.ddp_reason})")
    raise ValueError(f"unknown rung {key!r}; choose from {RUNG_KEYS}")
