"""The instrumented training loop: per-step data wait, host-to-device copy, forward, backward and
optimizer times; throughput (median, p10, p90 over steady-state steps), peak memory, utilisation,
achieved FLOP/s and MFU against the peak of the math mode that ran, validation accuracy.

On a GPU the phases are CUDA events read back once per ``read_every`` steps (one sync per window), so
the instrumented loop runs as fast as a bare one. ``sync_every_step=True`` synchronises at every phase
boundary instead: the classic timer, kept for the lesson that measures what those syncs cost.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import pandas as pd
import torch
from torch import nn

from labkit.core.clock import percentile
from labkit.core.device import device_label, get_device
from labkit.core.env import seed_everything
from labkit.core.progress import progress_bar
from labkit.core.step import prepare_model
from labkit.core.timing import PhaseClock, Stopwatch
from labkit.memory.device import baseline_bytes, peak_since
from labkit.training.config import TrainConfig
from labkit.training.flops import active_math_mode, checked_mfu, fp32_math_of, peak_flops_per_s
from labkit.training.sampling import UtilizationSampler
from labkit.training.stepper import Stepper
from labkit.training.window import PendingStep, TrainProgress, Window

if TYPE_CHECKING:
    from labkit.core.device_loader import BatchLoader


@dataclass(frozen=True)
class StepRecord:
    """One training step; every time in seconds.

    ``step_time_s`` runs from the end of the previous step to the end of this one, and ``data_wait_s`` to
    the step's first work: on a GPU (CUDA events) that is the time the GPU sat idle for the batch; on a
    CPU, the time the loop waited for the loader. The phases are disjoint parts of ``step_time_s``.
    """

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
    memory: object | None = None                 # labkit.memory.model.MemoryBreakdown at the run's batch size
    final_loss: float = math.nan
    math_mode: str = "fp32"                      # labkit.training.flops.active_math_mode: what the MFU peak is for
    peak_flops_per_s: float | None = None        # the peak MFU was computed against (None: no MFU)
    peak_mem_note: str = ""                      # how peak_mem_bytes was obtained (GPU: measured; CPU: predicted)
    extra: dict = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        """The per-step records as a pandas DataFrame."""
        return pd.DataFrame([asdict(r) for r in self.steps])


def evaluate_accuracy(model: nn.Module, loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
                      device: str | torch.device | None = None) -> float:
    """Top-1 accuracy of ``model`` over ``loader`` (eval mode, no grad; train mode restored)."""
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


def _batches(loader, config: TrainConfig) -> Iterator[tuple[int, object]]:
    """(epoch, batch) pairs until the configured steps or epochs are done."""
    if len(loader) == 0:
        raise ValueError("train_loader yields no batches (dataset smaller than batch_size with drop_last=True?)")
    epoch, done, total = 0, 0, _total_steps(loader, config)
    while done < total:
        for batch in loader:
            yield epoch, batch
            done += 1
            if done >= total:
                return
        epoch += 1


def _total_steps(loader, config: TrainConfig) -> int:
    return config.steps if config.steps is not None else config.epochs * len(loader)


def _summarise(records: list[StepRecord], config: TrainConfig) -> dict:
    """Throughput statistics over steady-state steps (warm-up excluded when enough steps remain)."""
    steady = records[config.warmup_steps:] or records
    wait = sum(r.data_wait_s for r in steady)          # NaN under whole-step timing: the phases were not timed
    busy = sum(r.step_time_s for r in steady)
    rates = [r.samples_per_s for r in steady]
    return dict(samples_per_s_median=statistics.median(rates), samples_per_s_p10=percentile(rates, 10),
                samples_per_s_p90=percentile(rates, 90),
                step_time_median_s=statistics.median(r.step_time_s for r in steady),
                data_wait_fraction=wait / busy if busy > 0 else 0.0)


def train(model: nn.Module, train_loader: BatchLoader, config: TrainConfig,
          val_loader: Iterable[tuple[torch.Tensor, torch.Tensor]] | None = None,
          callback: Callable[[StepRecord, TrainProgress], bool | None] | None = None) -> RunResult:
    """Train ``model`` and measure every step without stalling the device.

    ``callback(record, progress)`` runs every ``config.log_every`` steps with the newest StepRecord and
    a :class:`labkit.training.window.TrainProgress` (all records so far, the model, the last input batch, the run
    (its RunSpec) and its current LR, the device); returning True stops cleanly. A callback reads the timing
    marks back, so it costs one device sync: use ``log_every`` >= 10 on a GPU. Its time counts nowhere.
    """
    run = config.spec
    _check_loader_batch(train_loader, config.run)
    seed_everything(run.seed)
    device = get_device(config.device)
    baseline = baseline_bytes(device, model)          # other cells' tensors on the GPU: not this run's peak
    model = prepare_model(model, run.step_options(), device)
    clock = PhaseClock(device, config.sync_every_step)
    stepper = Stepper(model, run.build_optimizer(model), config, device, clock)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps = _Run(stepper, clock, config, _total_steps(train_loader, config), callback)
    with fp32_math_of(run), UtilizationSampler(device) as sampler, progress_bar(total=steps.total_steps, desc="training", unit="step",
                                                             enabled=config.progress) as bar, Stopwatch(device) as wall:
        steps.steps(_batches(train_loader, config), bar)
    if not steps.records:
        raise ValueError("no training steps ran")
    return _finish(model, stepper, steps.records, config, device, val_loader, sampler.summary(),
                   steps.stopped, device_label(device), wall.elapsed_s, baseline)


def _check_loader_batch(loader, run) -> None:
    """A config that names its run must train that run's batches: one batch size, not two that disagree."""
    batch = getattr(loader, "batch_size", None)
    if run is not None and isinstance(batch, int) and batch != run.batch_size:
        raise ValueError(f"the loader yields batches of {batch} but the config's run says batch_size="
                         f"{run.batch_size}: build the loader with run.loader(dataset), or give the run that batch")


class _Run:
    """The records of one run, read back window by window, and the callback's turn.

    A window closes every ``read_every`` steps; on a GPU it is read when the next one closes (the GPU has long
    passed its marks, so nothing waits). A due callback reads everything at once: it needs the newest rows.
    """

    def __init__(self, stepper, clock: PhaseClock, config: TrainConfig, total_steps: int, callback) -> None:
        self.stepper, self.clock, self.config, self.total_steps = stepper, clock, config, total_steps
        self.callback, self.pending, self.records, self.stopped = callback, [], [], False
        self.in_flight: list[Window] = []
        self.read_every = 1 if config.sync_every_step else config.read_every   # the classic loop reads each loss

    def steps(self, batches: Iterator[tuple[int, object]], bar) -> None:
        """Run every step, closing a window when due; a callback asking to stop ends the run."""
        start_mark = self.clock.mark()
        for i, (epoch, batch) in enumerate(batches):
            marks, loss, samples = self.stepper.step(i, batch)
            self.pending.append(PendingStep(i, epoch, start_mark, marks, loss, samples))
            start_mark = marks[-1]
            bar.update(1)
            if self.due(i):
                if self.close_window(i):
                    break
                start_mark = self.clock.mark()       # the read-back and callback count nowhere
        self.close_window(None)

    def due(self, i: int) -> bool:
        n = i + 1
        return n % self.read_every == 0 or (self.callback is not None and n % self.config.log_every == 0)

    def close_window(self, i: int | None) -> bool:
        """Close the pending steps into a window and read what is ready; ``i=None``: the end, read all.
        True = the callback asked to stop."""
        if self.pending:
            self.in_flight.append(Window(self.pending, self.clock))
            self.pending = []
        callback_due = (i is not None and self.callback is not None and (i + 1) % self.config.log_every == 0)
        keep = 0 if (i is None or callback_due or self.clock.mode != "events") else 1
        while len(self.in_flight) > keep:
            self.records.extend(StepRecord(**row) for row in self.in_flight.pop(0).read(self.clock))
        if not callback_due or not self.records:
            return False
        self.stopped = bool(self.callback(self.records[-1], self.progress()))
        return self.stopped

    def progress(self) -> TrainProgress:
        st, cfg = self.stepper, self.config
        return TrainProgress(records=tuple(self.records), steps_done=len(self.records), total_steps=self.total_steps,
                             model=st.model, last_inputs=st.last_inputs, run=cfg.spec,
                             lr=float(st.optimizer.param_groups[0]["lr"]), device=str(st.device))


def _finish(model, stepper, records, config, device, val_loader, util, stopped, label, wall_s,
            baseline: int) -> RunResult:
    """Read memory, FLOPs, MFU and accuracy once the timed steps are over."""
    stats = _summarise(records, config)
    flops, breakdown = stepper.probe() if config.profile_model else (None, None)
    achieved = flops * stats["samples_per_s_median"] if flops is not None else None
    mode = active_math_mode(device, config.spec.precision)
    peak, note = peak_flops_per_s(device, mode)
    if device.type == "cuda":
        peak_mem, reserved = peak_since(device, baseline)
        mem_note = f"measured: peak allocated minus the {baseline / 2**20:.0f} MiB other code held on the GPU"
    else:
        peak_mem, reserved = (breakdown.total_bytes if breakdown is not None else None), None
        mem_note = "predicted by the memory model (a CPU has no allocator peak)" if breakdown is not None else ""
    acc = evaluate_accuracy(model, val_loader, device) if (config.evaluate and val_loader is not None) else None
    wall_rate = sum(r.samples for r in records) / wall_s if wall_s > 0 else math.nan
    return RunResult(records, **stats, peak_mem_bytes=peak_mem, val_accuracy=acc, flops_per_sample=flops,
                     achieved_flops_per_s=achieved, mfu=checked_mfu(achieved, peak, note), mfu_note=note,
                     device=label, stopped_early=stopped, peak_reserved_bytes=reserved,
                     peak_rss_bytes=util.peak_rss_bytes, utilization_percent=util.mean_percent,
                     utilization_note=util.note, memory=breakdown, final_loss=records[-1].loss,
                     math_mode=mode, peak_flops_per_s=peak, peak_mem_note=mem_note,
                     extra={"wall_s": wall_s, "wall_samples_per_s": wall_rate, "timing": stepper.clock.mode,
                            "timed": config.timing, "events_created": stepper.clock.pool.created})
