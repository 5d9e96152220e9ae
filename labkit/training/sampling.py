"""Utilisation sampled in a background thread: NVML on a GPU, the process's CPU use and RSS on a CPU.

"GPU utilization" as NVML (and nvidia-smi) reports it is the fraction of the sample period during
which *a kernel was running* on the GPU — not how busy its streaming multiprocessors were. A tiny
kernel running all the time reads 100%. It is still the quickest sign of data starvation.
"""
from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from labkit.core.gpu_neighbours import nvml_handle
from labkit.core.validation import positive_number


@dataclass(frozen=True)
class UtilizationSummary:
    """What a sampler saw over a run."""

    kind: str                       # "gpu" (NVML kernel-busy %) | "cpu" (process CPU % of one core x cores)
    mean_percent: float | None
    samples: int
    peak_rss_bytes: int | None      # process resident memory (CPU runs)
    note: str


def nvml_device_utilization(index: int = 0) -> tuple[int, int, int] | None:
    """(gpu_util_percent, mem_used_bytes, mem_total_bytes) from NVML, or None when NVML is unavailable."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        handle = nvml_handle(index)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(util.gpu), int(mem.used), int(mem.total)
    except pynvml.NVMLError:
        return None


class UtilizationSampler:
    """``with UtilizationSampler(device) as s: ...; s.summary()`` — samples every ``interval_s`` in a thread."""

    def __init__(self, device: str | torch.device = "cpu", interval_s: float | None = None) -> None:
        self.device = torch.device(device)
        if interval_s is None:              # rarely on CPU: a waking thread can stall the intra-op thread pool
            interval_s = 0.1 if self.device.type == "cuda" else 0.5
        self.interval_s = positive_number(interval_s, "interval_s", hint="seconds between samples")
        self._values: list[float] = []
        self._peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._note = ""

    # -------------------------------------------------------------- per-kind probes
    def _open(self):
        if self.device.type == "cuda":
            try:
                import pynvml

                idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
                handle = nvml_handle(idx)
                return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception as err:  # noqa: BLE001 - NVML missing or refused: say so, do not guess
                self._note = f"NVML unavailable ({type(err).__name__}); GPU utilisation not sampled"
                return None
        proc = psutil.Process()
        proc.cpu_percent(None)                                 # prime: the first call always returns 0.0

        def probe() -> float:
            self._peak_rss = max(self._peak_rss, proc.memory_info().rss)
            return proc.cpu_percent(None)
        return probe

    def _loop(self, probe) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._values.append(probe())
            except Exception:  # noqa: BLE001 - a failed sample is skipped, never crashes training
                pass

    def __enter__(self) -> "UtilizationSampler":
        probe = self._open()
        if probe is not None:
            self._thread = threading.Thread(target=self._loop, args=(probe,), daemon=True, name="labkit-sampler")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 1)

    def summary(self) -> UtilizationSummary:
        """Mean utilisation over the samples taken (None when there were none)."""
        mean = statistics.fmean(self._values) if self._values else None
        if self.device.type == "cuda":
            note = self._note or "NVML GPU utilisation: % of time a kernel was running (not SM occupancy)"
            return UtilizationSummary("gpu", mean, len(self._values), None, note)
        note = "process CPU use in % of one core (200% = two cores busy)"
        if not self._values:
            note = "run too short to sample CPU use"
        return UtilizationSummary("cpu", mean, len(self._values), self._peak_rss or None, note)
