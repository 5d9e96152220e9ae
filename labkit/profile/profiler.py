"""Profile a few training steps with ``torch.profiler`` and say where the time went.

The profiler runs on a *schedule*: ``wait`` steps untouched (let caches and the allocator settle),
``warmup`` steps traced but thrown away (the tracer's own start-up cost), ``active`` steps kept,
the whole cycle ``repeat`` times. Each kept cycle is written as a Chrome/Perfetto JSON trace into
``run_dir`` (open it at https://ui.perfetto.dev or chrome://tracing). The TensorBoard PyTorch
profiler plugin is deprecated and removed upstream, so nothing here depends on it.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import warnings
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from labkit.core.device import device_label, get_device
from labkit.core.results import WriteError, atomic_path
from labkit.core.rundirs import check_writable_dir
from labkit.core.step import TrainStep
from labkit.core.torch_compat import dump_memory_snapshot, record_memory_history
from labkit.core.validation import checked_int
from labkit.profile.schedule import ProfileSchedule
from labkit.profile.summary import ProfileSummary
from labkit.profile.traces import CATEGORIES, LABEL_PREFIX, summarize_trace

KINETO_LOG_LEVEL_ENV_VAR = "KINETO_LOG_LEVEL"


# ------------------------------------------------------------------------------------------ helpers
def _activities(device: torch.device) -> list[ProfilerActivity]:
    """CPU activity always; CUDA activity only for a run on a GPU that exists."""
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda" and torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def quiet_gpu_probe_without_gpu() -> None:
    """Hide Kineto's log lines on machines with no GPU: 'ERROR: ... gpuGetDeviceCount failed' and the markers.

    A CUDA build of PyTorch asks for the GPUs' properties when it writes a trace, even for a CPU-only
    profile; with no GPU that probe logs an ERROR that is not one. Kineto's levels are VERBOSE 0, INFO 1,
    WARNING 2, ERROR 3, STAGE 4 and USDT 5 (its 'USDT: ... profiler_start' / 'profiler_stop' markers), and it
    prints those at or above ``KINETO_LOG_LEVEL``: 6 prints none of them. Kineto reads the variable when the
    profiler first starts in a process. A value the user set wins; on a GPU Kineto's errors (CUPTI) matter and
    are left alone.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault(KINETO_LOG_LEVEL_ENV_VAR, "6")


def _batches(loader: Iterable, steps: int):
    """Yield ``steps`` batches, starting the loader again when it runs out (clear error if empty)."""
    produced = 0
    while produced < steps:
        before = produced
        for batch in loader:
            yield batch
            produced += 1
            if produced == steps:
                return
        if produced == before:
            raise ValueError("the loader yielded no batches; give profile_training a non-empty loader")


def _labelled(name: str) -> record_function:
    """Each phase of the one step as a labelled region of the trace (labkit/h2d, labkit/forward, ...)."""
    return record_function(LABEL_PREFIX + name)


def labelled_step(step: TrainStep, batch: Sequence[torch.Tensor], sync_every_step: bool) -> int:
    """One step of the kit's training step with every phase labelled (and an optional ``.item()`` sync, labelled
    too); returns the batch size."""
    loss, samples, _ = step(batch[0], batch[1], phase=_labelled)
    if sync_every_step:
        with record_function(LABEL_PREFIX + "sync"):
            loss.item()   # a host-device sync point: the CPU waits for the GPU every step
    return samples


class CycleRecorder:
    """The profiler's ``on_trace_ready``: writes each finished cycle's trace and adds up its operators."""

    def __init__(self, run_dir: Path, row_limit: int, on_trace: Callable[[Path], None] | None = None) -> None:
        self.run_dir, self.row_limit, self.on_trace = run_dir, row_limit, on_trace
        self.trace_files: list[Path] = []
        self.error: WriteError | None = None   # a failed export, raised by the training loop (not inside torch)
        self.unwinding = False           # training stopped mid-cycle: the profiler's exit must not export that cycle
        self.ops: dict[str, dict] = {}   # name -> self_cpu_s, self_device_s, calls (totals across cycles)
        self.op_table = ""               # the last cycle's key_averages grouped by input shape, as text

    def __call__(self, prof) -> None:
        if self.unwinding:               # torch exports the cycle cut short on exit: it is not a finished cycle
            return
        path = self.run_dir / f"trace_cycle{len(self.trace_files)}.pt.trace.json"
        try:
            with atomic_path(path) as tmp:      # a reader never sees half a trace; a full disk leaves no temp file
                try:
                    prof.export_chrome_trace(str(tmp))
                finally:
                    Path(f"{tmp}.tmp").unlink(missing_ok=True)  # torch's own temp file, left when its write fails
        except WriteError as err:
            self.error = err
            return
        self.trace_files.append(path)
        if self.on_trace is not None:    # at once: an interrupt while the operators are added keeps it listed
            self.on_trace(path)
        self._add_ops(prof)

    def _add_ops(self, prof) -> None:
        """Add one finished cycle's operator self-times to the per-op totals."""
        for avg in prof.key_averages():
            if avg.key.startswith(LABEL_PREFIX) or avg.key.startswith("ProfilerStep"):
                continue
            row = self.ops.setdefault(avg.key, dict(name=avg.key, self_cpu_s=0.0, self_device_s=0.0, calls=0))
            row["self_cpu_s"] += avg.self_cpu_time_total * 1e-6
            row["self_device_s"] += getattr(avg, "self_device_time_total", 0.0) * 1e-6
            row["calls"] += avg.count
        on_device = any(r["self_device_s"] for r in self.ops.values())
        sort_key = "self_device_time_total" if on_device else "self_cpu_time_total"
        self.op_table = prof.key_averages(group_by_input_shape=True).table(sort_by=sort_key, row_limit=self.row_limit)


# Holistic Trace Analysis is published as `traceinsight` (Meta's maintained successor; the old
# `HolisticTraceAnalysis` releases stopped at 0.5.0); its import name is still `hta`. Checked with traceinsight
# 0.6.1 on a CPU-only torch trace: it parses the trace and lists the ProfilerSteps, but its analyses are of GPU
# kernels (temporal and idle-time breakdowns fail, kernel tables come back empty), so the kit runs it on GPUs only.
HTA_PACKAGE, HTA_IMPORT = "traceinsight", "hta"


def _gpu_extras(dev: torch.device, run_dir: Path, snapshot: bool, hta: bool) -> dict:
    """CUDA memory snapshot and Holistic Trace Analysis, when asked for and possible (never fatal)."""
    extras: dict = {}
    if snapshot and dev.type == "cuda":
        path = run_dir / "memory_snapshot.pickle"
        dump_memory_snapshot(path)
        extras["memory_snapshot"] = path   # drag onto https://pytorch.org/memory_viz
    if hta:
        if dev.type != "cuda":
            extras["hta"] = ("skipped: Holistic Trace Analysis (`pip install traceinsight`, import hta) analyses GPU "
                             "kernels; on a CPU-only trace it finds the steps but no kernels to break down")
        else:
            try:
                from hta.trace_analysis import TraceAnalysis

                extras["hta"] = TraceAnalysis(trace_dir=str(run_dir)).get_temporal_breakdown(visualize=False)
            except Exception as err:  # noqa: BLE001 - optional tool; report, do not fail the profile
                extras["hta"] = f"skipped: HTA unavailable or failed ({type(err).__name__}: {err}); " \
                                f"pip install {HTA_PACKAGE} (import name {HTA_IMPORT})"
    return extras


def profile_training(model: nn.Module, loader: Iterable, *, run_dir: str | Path, wait: int = 1, warmup: int = 1,
                     active: int = 3, repeat: int = 1, skip_first: int = 0, steps: int | None = None,
                     optimizer: torch.optim.Optimizer | None = None, loss_fn: Callable | None = None,
                     lr: float = 0.01, device: str | torch.device | None = None, sync_every_step: bool = False,
                     record_shapes: bool = True, profile_memory: bool = True, with_stack: bool = False,
                     memory_snapshot: bool = False, hta: bool = False, row_limit: int = 12,
                     on_trace: Callable[[Path], None] | None = None) -> ProfileSummary:
    """Train labelled steps under ``torch.profiler`` until every cycle's trace is written; summarise the kept ones.

    Training stops once the last cycle's trace is written, even if ``steps`` allows more; ``on_trace`` receives
    each trace file as it is written. A trace that cannot be written raises one WriteError naming it.

    Categories are measured on the host (CPU) timeline. On a GPU the host only *launches* work, so time the
    GPU spends computing shows up where the CPU next waits for it (``sync``, or a later copy); the trace's GPU
    rows and ``extras['gpu_busy_fraction']`` give the device view.
    """
    sched = ProfileSchedule(wait, warmup, active, repeat, skip_first)
    steps = sched.steps_needed if steps is None else steps
    checked_int(steps, "steps", minimum=sched.steps_needed,
                hint=f"fewer than the schedule needs: skip_first + (wait + warmup + active) x repeat = "
                     f"{sched.steps_needed}; run more steps or shrink the schedule")
    run_dir = _fresh_run_dir(run_dir)
    dev = get_device(device)
    model = model.to(dev).train()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    step = TrainStep(model, optimizer, loss_fn=loss_fn or nn.functional.cross_entropy, device=dev)
    recorder = CycleRecorder(run_dir, row_limit, on_trace)
    snapshot = memory_snapshot and dev.type == "cuda"
    quiet_gpu_probe_without_gpu()
    with _cuda_memory_recording(dev, snapshot):
        samples = _profiled_steps(lambda batch: labelled_step(step, batch, sync_every_step),
                                  loader, steps, recorder, sched.repeat, activities=_activities(dev),
                                  schedule=sched.to_torch(),
                                  on_trace_ready=recorder, record_shapes=record_shapes,
                                  profile_memory=profile_memory, with_stack=with_stack)
        extras = _gpu_extras(dev, run_dir, snapshot, hta)
    return _summarize(recorder, sched, samples, dev, extras)


def _fresh_run_dir(run_dir: str | Path) -> Path:
    """``run_dir``, proven writable, without the traces of an earlier run (a rerun must not mix them in)."""
    run_dir = check_writable_dir(run_dir)
    for old in run_dir.glob("trace_cycle*.json"):
        old.unlink()
    return run_dir


@contextlib.contextmanager
def _cuda_memory_recording(dev: torch.device, snapshot: bool) -> Iterator[None]:
    """Reset CUDA's peak-memory counter, and record the allocator's history for a snapshot, around a run."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if snapshot:
        record_memory_history(True, max_entries=100_000)
    try:
        yield
    finally:
        if snapshot:
            record_memory_history(False)


def _profiled_steps(step: Callable[[object], int], loader: Iterable, steps: int, recorder: CycleRecorder,
                    cycles: int, **profile_kwargs) -> list[int]:
    """Train under ``torch.profiler`` until ``cycles`` traces are written (at most ``steps``); samples per step."""
    samples = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        try:
            with profile(**profile_kwargs) as prof:   # leaving the block stops the profiler, even on an exception
                try:
                    for batch in _labelled_batches(loader, steps):
                        samples.append(step(batch))
                        prof.step()
                        if recorder.error is not None or (cycles and len(recorder.trace_files) >= cycles):
                            break                      # every trace is written (or one cannot be): stop training
                except BaseException:
                    recorder.unwinding = True
                    raise
        except AssertionError as err:     # torch's record_function, unwound by Ctrl-C/SIGTERM, asserts on exit
            interrupt = err.__context__
            if isinstance(interrupt, (KeyboardInterrupt, SystemExit)):
                raise interrupt from None
            raise
    if recorder.error is not None:
        raise recorder.error
    return samples


def _labelled_batches(loader: Iterable, steps: int):
    """Yield ``steps`` batches, each fetched inside a ``labkit/data_loading`` label."""
    batches = _batches(loader, steps)
    for _ in range(steps):
        with record_function(LABEL_PREFIX + "data_loading"):
            batch = next(batches)
        yield batch


def _summarize(recorder: CycleRecorder, sched: ProfileSchedule, samples: list[int], dev: torch.device,
               extras: dict) -> ProfileSummary:
    """Combine the per-cycle trace files into one ProfileSummary."""
    stats = [summarize_trace(p, device_type=1 if dev.type == "cuda" else 0) for p in recorder.trace_files]
    steps = [n for s in stats for n in s.steps]
    n = max(len(steps), 1)
    times = [t for s in stats for t in s.step_time_s]
    category_s = {c: sum(s.category_s[c] for s in stats) / n for c in CATEGORIES}
    kept = [samples[i] for i in sched.active_step_numbers() if i < len(samples)]
    top = sorted(recorder.ops.values(), key=lambda r: r["self_device_s"] or r["self_cpu_s"], reverse=True)
    top = [{**r, "self_cpu_s": r["self_cpu_s"] / n, "self_device_s": r["self_device_s"] / n,
            "calls": r["calls"] / n} for r in top]
    if dev.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(dev))
        extras["peak_mem_note"] = "torch.cuda.max_memory_allocated over the whole profiled run"
    else:
        peaks = [s.peak_mem_bytes for s in stats if s.peak_mem_bytes is not None]
        peak = max(peaks) if peaks else None
        extras["peak_mem_note"] = "CPU bytes allocated during the profiled steps, on top of what existed before"
    busy = [s.gpu_busy_s for s in stats if s.gpu_busy_s is not None]
    if busy and times:
        extras["gpu_busy_fraction"] = sum(busy) / sum(times)
    return ProfileSummary(recorder.run_dir, recorder.trace_files, sched, len(steps), steps,
                          int(statistics.median(kept)) if kept else 0,
                          statistics.median(times) if times else float("nan"), category_s, top,
                          recorder.op_table, peak, sum(s.item_calls for s in stats) / n,
                          device_label(dev), extras)
