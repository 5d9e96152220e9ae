"""The instrumented training loop: per-step data wait, host-to-device copy, forward, backward and
optimizer times; throughput (median, p10, p90 over steady-state steps), peak memory, utilisation,
achieved FLOP/s and MFU, validation accuracy — at a cost of well under 3% of a bare loop.

On a GPU each phase boundary synchronises the device (``sync_every_step=True``), so the clock reads
"done", not "launched". ``sync_every_step=False`` trains production-style without per-step syncs and
measures throughput over the whole window instead.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn

from labkit.timing import percentile, synchronize

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainConfig:
    """How to train: length (steps or epochs), optimizer, precision, and what to measure."""

    steps: int | None = None
    epochs: int | None = None
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    warmup_steps: int = 2
    device: str | None = None
    amp_dtype: str | None = None
    channels_last: bool = False
    compile: bool = False
    sync_every_step: bool = True
    evaluate: bool = True
    seed: int = 0
    progress: bool = True
    log_every: int = 1
    profile_model: bool = True      # count FLOPs and fit the memory model on a 2- and 4-sample probe
    lr_warmup_steps: int = 0        # linear LR warm-up from lr/10 (Goyal et al. 2017, section 2.2)

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of steps= or epochs= (e.g. TrainConfig(steps=50))")
        for name in ("steps", "epochs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not (self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if self.amp_dtype not in (None, *AMP_DTYPES):
            raise ValueError(f"amp_dtype must be None, 'bf16' or 'fp16', got {self.amp_dtype!r}")
        for name in ("warmup_steps", "lr_warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")

    @classmethod
    def fast(cls, **overrides) -> "TrainConfig":
        """A CPU-sized preset for tests and fast mode: 10 steps, no progress bar."""
        return cls(**{"steps": 10, "progress": False, **overrides})


@dataclass(frozen=True)
class StepRecord:
    """One training step; every time in seconds (NaN where not measured)."""

    step: int
    epoch: int
    data_wait_s: float
    h2d_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    step_time_s: float
    loss: float
    samples: int
    samples_per_s: float


@dataclass
class RunResult:
    """What a run measured; ``to_dataframe()`` gives the per-step table."""

    steps: list[StepRecord]
    samples_per_s_median: float
    samples_per_s_p10: float
    samples_per_s_p90: float
    step_time_median_s: float
    data_wait_fraction: float
    peak_mem_bytes: int | None
    val_accuracy: float | None
    flops_per_sample: float | None
    achieved_flops_per_s: float | None
    mfu: float | None
    mfu_note: str
    device: str
    stopped_early: bool
    peak_reserved_bytes: int | None = None       # CUDA caching allocator (GPU only)
    peak_rss_bytes: int | None = None            # process resident memory (CPU only)
    utilization_percent: float | None = None     # NVML kernel-busy % on GPU; process CPU % on CPU
    utilization_note: str = ""
    memory: object | None = None                 # labkit.memory.MemoryBreakdown at the run's batch size
    final_loss: float = math.nan
    extra: dict = field(default_factory=dict)

    def to_dataframe(self):
        """The per-step records as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.steps])


def evaluate_accuracy(model: nn.Module, loader, device: str | torch.device | None = None) -> float:
    """Top-1 accuracy of ``model`` over ``loader`` (eval mode, no grad; train mode restored)."""
    from labkit.env import get_device

    dev = get_device(device) if device is not None else next(model.parameters()).device
    was_training, correct, total = model.training, 0, 0
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            pred = model(x.to(dev, non_blocking=True)).argmax(dim=1)
            correct += int((pred == y.to(dev)).sum())
            total += int(y.numel())
    model.train(was_training)
    if total == 0:
        raise ValueError("validation loader yielded no samples")
    return correct / total


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (with momentum) or Adam, as the config says."""
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)


def _batches(loader, config: TrainConfig) -> Iterator[tuple[int, object]]:
    """(epoch, batch) pairs until the configured steps or epochs are done."""
    if len(loader) == 0:
        raise ValueError("train_loader yields no batches (dataset smaller than batch_size with drop_last=True?)")
    epoch, done = 0, 0
    total = config.steps if config.steps is not None else config.epochs * len(loader)
    while done < total:
        for batch in loader:
            yield epoch, batch
            done += 1
            if done >= total:
                return
        epoch += 1


def _total_steps(loader, config: TrainConfig) -> int:
    return config.steps if config.steps is not None else config.epochs * len(loader)


def _prepare(model: nn.Module, config: TrainConfig, device: torch.device) -> nn.Module:
    model.to(device)
    if config.channels_last:
        model.to(memory_format=torch.channels_last)
    if config.amp_dtype == "fp16" and device.type != "cuda":
        raise ValueError("amp_dtype='fp16' needs a CUDA GPU (it uses a GradScaler); use amp_dtype='bf16' on CPU")
    if config.compile:
        try:
            return torch.compile(model)
        except Exception as err:  # noqa: BLE001
            raise RuntimeError(f"torch.compile is not usable here ({type(err).__name__}: {err}); "
                               "set compile=False") from None
    return model


def _summarise(records: list[StepRecord], config: TrainConfig, window_s: float) -> dict:
    """Throughput statistics over steady-state steps (warm-up excluded when enough steps remain)."""
    steady = records[config.warmup_steps:] or records
    wait = sum(r.data_wait_s for r in steady)
    busy = sum(r.step_time_s for r in steady)
    if config.sync_every_step:
        rates = [r.samples_per_s for r in steady]
        med, p10, p90 = statistics.median(rates), percentile(rates, 10), percentile(rates, 90)
        step_med = statistics.median(r.step_time_s for r in steady)
    else:   # no per-step sync: only the whole window's rate is honest
        med = p10 = p90 = sum(r.samples for r in steady) / window_s
        step_med = window_s / len(steady)
    return dict(samples_per_s_median=med, samples_per_s_p10=p10, samples_per_s_p90=p90,
                step_time_median_s=step_med, data_wait_fraction=wait / busy if busy > 0 else 0.0)


def train(model: nn.Module, train_loader, config: TrainConfig, val_loader=None,
          callback: Callable[[StepRecord, dict], bool | None] | None = None) -> RunResult:
    """Train ``model`` and measure every step; ``callback(record, so_far)`` returning True stops cleanly.

    ``so_far`` is ``{"records": [StepRecord, ...], "stepper": Stepper}`` (the records up to now, and the
    stepper holding model, optimizer and the last batch). Time spent in the callback is not counted.
    """
    from labkit.env import device_label, get_device, seed_everything
    from labkit.sampling import UtilizationSampler
    from labkit.stepper import Stepper

    seed_everything(config.seed)
    device = get_device(config.device)
    model = _prepare(model, config, device)
    stepper = Stepper(model, make_optimizer(model, config), config, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    records: list[StepRecord] = []
    stopped = False
    bar = _progress(_total_steps(train_loader, config), config.progress)
    with UtilizationSampler(device) as sampler:
        synchronize(device)
        start_s = time.perf_counter()
        window_start_s = start_s
        clock = start_s
        for i, (epoch, batch) in enumerate(_batches(train_loader, config)):
            got_s = time.perf_counter()
            phases = stepper.step(i, batch)
            now_s = time.perf_counter()
            step_time_s = now_s - clock
            rec = StepRecord(step=i, epoch=epoch, data_wait_s=got_s - clock, step_time_s=step_time_s,
                             samples_per_s=phases["samples"] / step_time_s, **phases)
            records.append(rec)
            bar.update(1)
            if callback is not None and (i + 1) % config.log_every == 0:
                if callback(rec, {"records": records, "stepper": stepper}):
                    stopped = True
                    break
            if i + 1 == config.warmup_steps:
                synchronize(device)
                window_start_s = time.perf_counter()
            clock = time.perf_counter() if callback is not None else now_s   # callback time counts nowhere
        synchronize(device)
        window_s = time.perf_counter() - (window_start_s if len(records) > config.warmup_steps else start_s)
    bar.close()
    if not records:
        raise ValueError("no training steps ran")
    return _finish(model, stepper, records, config, device, val_loader, sampler.summary(), window_s,
                   stopped, device_label(device))


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="training", unit="step", leave=False)


class _NoBar:
    def update(self, n: int) -> None:  # noqa: D401 - a do-nothing progress bar
        pass

    def close(self) -> None:
        pass


def _finish(model, stepper, records, config, device, val_loader, util, window_s, stopped, label) -> RunResult:
    """Read memory, FLOPs, MFU and accuracy once the timed steps are over."""
    from labkit.flops import mfu, peak_flops_per_s

    stats = _summarise(records, config, window_s)
    final_loss = stepper.final_loss()
    if not config.sync_every_step:
        records[-1] = StepRecord(**{**asdict(records[-1]), "loss": final_loss})
    flops, breakdown = stepper.probe() if config.profile_model else (None, None)
    achieved = flops * stats["samples_per_s_median"] if flops is not None else None
    peak, note = peak_flops_per_s(device, config.amp_dtype)
    if device.type == "cuda":
        peak_mem = int(torch.cuda.max_memory_allocated(device))
        reserved = int(torch.cuda.max_memory_reserved(device))
    else:
        peak_mem, reserved = (breakdown.total_bytes if breakdown is not None else None), None
    acc = evaluate_accuracy(model, val_loader, device) if (config.evaluate and val_loader is not None) else None
    return RunResult(records, **stats, peak_mem_bytes=peak_mem, val_accuracy=acc, flops_per_sample=flops,
                     achieved_flops_per_s=achieved, mfu=mfu(achieved, peak), mfu_note=note, device=label,
                     stopped_early=stopped, peak_reserved_bytes=reserved, peak_rss_bytes=util.peak_rss_bytes,
                     utilization_percent=util.mean_percent, utilization_note=util.note, memory=breakdown,
                     final_loss=final_loss)
