"""Who else is computing on this GPU: the GPU's contention as a number, as :mod:`labkit.core.contention` is the CPU's.

A second process on the same GPU time-slices its kernels with ours: a many-kernel version of a job slows more than a
fused one, so a timing lesson can fail for a reason that is not its own (the H200 run: notebook 03b's fusion bound
read 29.9x against 11x beside another notebook, and passed alone). NVML lists the processes holding a context on
each GPU and, per process, the share of the SMs it kept busy over a recent window
(``nvmlDeviceGetProcessUtilization``). A neighbour is a process outside this process tree that kept the SMs busy
while we measured; a process that only holds a context (an idle notebook) is not one. Where per-process figures
are missing, a neighbour is any other process holding memory on a GPU that was busy. Torch-free: NVML only,
opened once per process (:func:`nvml_handle`, the kit's one handle).
"""
from __future__ import annotations

import functools
from typing import Any

import psutil

from labkit.core.clock import timestamp_s


@functools.lru_cache(maxsize=None)
def nvml_handle(index: int) -> Any:
    """NVML opened once per process and kept (as torch keeps its CUDA context): ``nvmlInit`` enumerates the
    devices, and a run that opened and shut NVML every time paid that as start-up on every call."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByIndex(index)


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    """GPUs NVML sees (0 without NVML or a driver): the meter does nothing on a CPU-only machine."""
    try:
        import pynvml

        nvml_handle(0)
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001  (no pynvml, no driver, no device: nothing to watch)
        return 0


def own_tree() -> set[int]:
    """This process, its ancestors and its descendants: a notebook's ranks are not its neighbours."""
    me = psutil.Process()
    pids = {me.pid, *(p.pid for p in me.parents())}
    try:
        pids |= {p.pid for p in me.children(recursive=True)}
    except psutil.Error:
        pass
    return pids


def _busy_by_pid(handle: Any, since_us: int) -> dict[int, int] | None:
    """pid -> SM utilisation (%) since ``since_us`` (NVML's own clock), or None where the driver gives none."""
    import pynvml

    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
    except pynvml.NVMLError as err:
        return {} if "Not Found" in str(err) else None       # NOT_FOUND: no process ran a kernel in the window
    busy: dict[int, int] = {}
    for s in samples:
        busy[int(s.pid)] = max(busy.get(int(s.pid), 0), int(s.smUtil))
    return busy


def _holders(handle: Any) -> dict[int, int]:
    """pid -> GPU memory (bytes) of every process holding a compute context on this GPU."""
    import pynvml

    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}


def gpu_neighbours(since_stamp_s: float, exclude: set[int] | None = None) -> dict[str, float]:
    """Other processes that computed on any GPU since ``since_stamp_s`` (a :func:`labkit.core.clock.timestamp_s`,
    the clock NVML stamps its samples with): label -> the largest share of the SMs it kept busy (0..1).

    Empty on a machine without NVML. A label reads 'pid 4242 on GPU 0 (3.1 GiB)'."""
    count = gpu_count()
    if count == 0:
        return {}
    import pynvml

    mine = own_tree() if exclude is None else exclude
    since_us = max(0, int(since_stamp_s * 1e6))
    found: dict[str, float] = {}
    for index in range(count):
        handle = nvml_handle(index)
        try:
            holders = _holders(handle)
            busy = _busy_by_pid(handle, since_us)
            device_busy = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except pynvml.NVMLError:
            continue
        for pid, mem in holders.items():
            if pid in mine:
                continue
            share = (busy.get(pid, 0) if busy is not None else (device_busy if device_busy else 0)) / 100
            if share > 0:
                found[f"pid {pid} on GPU {index} ({mem / 2**30:.1f} GiB)"] = min(1.0, share)
    return found


def describe_neighbours(neighbours: dict[str, float]) -> str:
    """'pid 4242 on GPU 0 (3.1 GiB) kept 37% of the SMs busy' for a verdict's reason line."""
    return ", ".join(f"{name} kept {share:.0%} of the SMs busy" for name, share in neighbours.items())

