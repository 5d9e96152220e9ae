"""The rungs of the tuning ladder: what each one switches on, whether this machine can use it, and how
one recipe is trained and measured (in this process, or on N processes with DDP for the last rung).

Every recipe is trained by the instrumented loop (:func:`labkit.loop.train`) for the same number of
samples, so throughput *and* accuracy after a fixed budget are compared like for like.
"""
from __future__ import annotations

import dataclasses
import math
import shutil
from dataclasses import dataclass

import torch

RUNG_KEYS = ("naive", "batch_size", "input_pipeline", "no_sync", "mixed_precision", "channels_last",
             "compile", "ddp")


@dataclass(frozen=True)
class Recipe:
    """The cumulative training recipe one rung measures (``batch_size`` is per process)."""

    batch_size: int = 1
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    sync_every_step: bool = True
    amp_dtype: str | None = None
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
             "Batch 1, fp32, data loaded in the training process, the loss read with .item() every step.\n"
             "The recipe of many first scripts; every later rung is measured against it.", "02_batch_size.ipynb"),
    RungSpec(1, "batch_size", "good batch size",
             "A batch that fits (the finder) and is fastest in a short measured probe, LR scaled linearly.\n"
             "Per-step overheads are paid once per batch instead of once per sample (Goyal et al. 2017).",
             "02_batch_size.ipynb"),
    RungSpec(2, "input_pipeline", "input pipeline",
             "DataLoader workers, pinned memory, prefetching and persistent workers.\n"
             "Batches are prepared while the model computes; helps when loading is slow, costs cores when not.",
             "04_input_pipelines.ipynb"),
    RungSpec(3, "no_sync", "no per-step sync",
             "No per-step loss.item() and no phase timers: the host never waits for the device mid-run.\n"
             "On a GPU the host queues the next step while the current one runs; on a CPU there is little to win.",
             "03_profiling.ipynb"),
    RungSpec(4, "mixed_precision", "mixed precision",
             "Autocast to bf16 (or fp16 with a GradScaler where bf16 is missing), master weights in fp32.\n"
             "Tensor cores run 16-bit math much faster (Micikevicius et al. 2018); CPUs often do not.",
             "08_tensorflow_distribution.ipynb"),
    RungSpec(5, "channels_last", "channels_last",
             "Model weights and inputs in NHWC memory order.\n"
             "Convolution kernels for tensor cores (and oneDNN) prefer NHWC; others convert back and forth.",
             "03_profiling.ipynb"),
    RungSpec(6, "compile", "torch.compile",
             "TorchDynamo captures the model, Inductor fuses its operations into generated kernels.\n"
             "Fewer, fused kernels; a one-off compile time, reported separately (Ansel et al. 2024).",
             "03_profiling.ipynb"),
    RungSpec(7, "ddp", "DDP, all local devices",
             "One process per device (NCCL on GPUs, gloo processes on a CPU); gradients all-reduced every step.\n"
             "Global batch and LR scale with the number of processes (Goyal et al. 2017; Li et al. 2020).",
             "07_synchronous_sgd.ipynb"),
)


@dataclass(frozen=True)
class Capabilities:
    """What this machine offers the ladder, with the reason for each 'no'."""

    device_type: str
    cpu_cores: int
    amp_dtype: str
    compile_ok: bool
    compile_reason: str
    ddp_world_size: int
    ddp_reason: str
    num_workers: int


def compiler_status(device_type: str) -> tuple[bool, str]:
    """Whether torch.compile's default backend can generate code here, and why not."""
    try:
        import torch._dynamo as dynamo

        if not dynamo.is_dynamo_supported():
            return False, "TorchDynamo does not support this Python/platform"
    except Exception as err:  # noqa: BLE001 - any import failure means "no compiler"
        return False, f"torch._dynamo unavailable ({type(err).__name__})"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return (True, "Triton found") if has_triton() else (False, "Triton is not installed (Inductor needs it on GPU)")
    cxx = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    return (True, f"C++ compiler {cxx}") if cxx else (False, "no C++ compiler found (Inductor needs one on CPU)")


def detect_capabilities(device: torch.device, ddp_world_size: int | None = None,
                        num_workers: int | None = None) -> Capabilities:
    """Probe the device for bf16, a compiler, and how many processes DDP gets."""
    from labkit.env import cpu_count

    cores = cpu_count()
    if device.type == "cuda":
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        devices, what = torch.cuda.device_count(), "GPU(s)"
    else:
        amp, devices, what = "bf16", min(2, cores), "CPU core(s) for gloo processes"
    world = ddp_world_size if ddp_world_size is not None else devices
    reason = (f"{world} processes" if world >= 2 else
              f"only {devices} {what} here; data parallelism needs at least 2 processes")
    ok, why = compiler_status(device.type)
    workers = num_workers if num_workers is not None else max(1, min(4, cores // 2))
    return Capabilities(device.type, cores, amp, ok, why, world, reason, workers)


def propose(key: str, recipe: Recipe, caps: Capabilities, batch_size: int) -> tuple[Recipe | None, str]:
    """(the recipe with rung ``key`` switched on, what changed) or (None, why it is unsupported here)."""
    if key == "naive":
        return Recipe(), "batch 1, fp32, no workers, .item() every step"
    if key == "batch_size":
        return dataclasses.replace(recipe, batch_size=batch_size), f"batch {recipe.batch_size} -> {batch_size}"
    if key == "input_pipeline":
        pin = caps.device_type == "cuda"
        return (dataclasses.replace(recipe, num_workers=caps.num_workers, pin_memory=pin, prefetch_factor=4,
                                    persistent_workers=True),
                f"{caps.num_workers} worker(s), prefetch 4, persistent, pinned memory {'on' if pin else 'n/a on CPU'}")
    if key == "no_sync":
        return dataclasses.replace(recipe, sync_every_step=False), "no per-step .item() / device sync"
    if key == "mixed_precision":
        return dataclasses.replace(recipe, amp_dtype=caps.amp_dtype), \
            f"autocast {caps.amp_dtype}" + (" + GradScaler" if caps.amp_dtype == "fp16" else "")
    if key == "channels_last":
        return dataclasses.replace(recipe, channels_last=True), "NHWC memory format"
    if key == "compile":
        if not caps.compile_ok:
            return None, caps.compile_reason
        return dataclasses.replace(recipe, compile=True), "torch.compile (Inductor)"
    if key == "ddp":
        if caps.ddp_world_size < 2:
            return None, caps.ddp_reason
        return (dataclasses.replace(recipe, world_size=caps.ddp_world_size),
                f"{caps.ddp_world_size} processes, global batch {recipe.batch_size * caps.ddp_world_size}, LR scaled")
    raise ValueError(f"unknown rung {key!r}; choose from {RUNG_KEYS}")


def train_loader(dataset, recipe: Recipe, seed: int):
    """The recipe's training loader; the shuffle has its own generator, so workers never change the order.

    (A DataLoader draws its workers' base seed from ``generator`` whenever an iterator starts, so sharing
    one generator with the sampler would give a different data order with and without workers.)
    """
    from torch.utils.data import DataLoader, RandomSampler

    from labkit.data import validate_batch_size, validate_num_workers

    batch = validate_batch_size(recipe.batch_size, len(dataset))
    extra = {"prefetch_factor": recipe.prefetch_factor,
             "persistent_workers": recipe.persistent_workers} if validate_num_workers(recipe.num_workers) else {}
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=recipe.num_workers, drop_last=True,
                      pin_memory=recipe.pin_memory and torch.cuda.is_available(),
                      generator=torch.Generator().manual_seed(seed + 1), **extra)


def steps_for_budget(budget_samples: int, global_batch: int, min_steps: int) -> int:
    """Steps that train on ``budget_samples`` samples at ``global_batch`` (at least ``min_steps``)."""
    return max(min_steps, budget_samples // global_batch)


@dataclass(frozen=True)
class Measurement:
    """What one recipe measured: throughput over the steady window, start-up cost, memory, accuracy."""

    samples_per_s: float
    step_time_s: float
    data_wait_fraction: float
    peak_mem_bytes: int | None
    flops_per_sample: float | None
    val_accuracy: float | None
    startup_s: float
    steps: int
    samples_trained: int


def summarise_run(result, warmup_steps: int, sync_every_step: bool) -> tuple[float, float, float]:
    """(samples/s, step time s, start-up s) over the steady window, one estimator for every recipe.

    With per-step sync the window is the sum of steady step times; without it, the loop's own window
    rate (the only honest figure when steps are not synchronised). Start-up = the warm-up steps' excess
    over steady steps (compile time, worker start-up, first allocations).
    """
    records = list(result.steps)
    steady = records[warmup_steps:] or records
    if sync_every_step:
        window_s = sum(r.step_time_s for r in steady)
        samples_per_s = sum(r.samples for r in steady) / window_s
    else:
        samples_per_s = float(result.samples_per_s_median)
    step_time_s = (sum(r.samples for r in steady) / len(steady)) / samples_per_s
    warm = records[:warmup_steps] if len(records) > warmup_steps else []
    startup_s = max(0.0, sum(r.step_time_s for r in warm) - len(warm) * step_time_s)
    return samples_per_s, step_time_s, startup_s


def measure_model(model, loader, val_loader, recipe: Recipe, *, steps: int, lr: float, warmup_steps: int,
                  seed: int, device: str, trainer=None, eval_model=None) -> Measurement:
    """Train ``model`` with ``recipe`` for ``steps`` in this process and measure it.

    Accuracy is read from ``eval_model`` (default ``model``): the plain module, never a compiled or DDP
    wrapper, so evaluation neither recompiles nor issues collectives.
    """
    from labkit.loop import TrainConfig, evaluate_accuracy, train

    cfg = TrainConfig(steps=steps, lr=lr, warmup_steps=warmup_steps, device=device, amp_dtype=recipe.amp_dtype,
                      channels_last=recipe.channels_last, compile=recipe.compile,
                      sync_every_step=recipe.sync_every_step, evaluate=False, seed=seed, progress=False,
                      profile_model=not recipe.compile)   # FLOP probes would recompile a compiled model
    result = (trainer or train)(model, loader, cfg)
    sps, step_s, startup_s = summarise_run(result, warmup_steps, recipe.sync_every_step)
    peak = result.peak_mem_bytes
    if peak is None and recipe.compile and torch.device(device).type == "cpu":
        peak = _memory_model_bytes(eval_model or model, loader, recipe)
    acc = evaluate_accuracy(eval_model or model, val_loader, device) if val_loader is not None else None
    samples = sum(r.samples for r in result.steps)
    return Measurement(sps, step_s, float(result.data_wait_fraction), peak, result.flops_per_sample, acc,
                       startup_s, len(result.steps), samples)


def _memory_model_bytes(model, loader, recipe: Recipe) -> int | None:
    """The memory model's training-memory estimate for the un-compiled module (CPU, compiled rung)."""
    from labkit.memory import build_memory_model

    try:
        x, _ = next(iter(loader))
        return int(build_memory_model(model, tuple(x.shape[1:]), "sgd", 0.9, amp_dtype=recipe.amp_dtype)
                   .predict(recipe.batch_size).total_bytes)
    except Exception:  # noqa: BLE001 - an estimate that cannot be made is reported as unknown
        return None


def mfu_of(flops_per_sample: float | None, samples_per_s: float, device: str, amp_dtype: str | None) -> float | None:
    """Model FLOPs utilisation of a measured throughput, or None where the peak is unknown."""
    from labkit.flops import mfu, peak_flops_per_s

    if flops_per_sample is None or not math.isfinite(samples_per_s):
        return None
    peak, _ = peak_flops_per_s(device, amp_dtype)
    return mfu(flops_per_sample * samples_per_s, peak)
