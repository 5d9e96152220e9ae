"""Who else computes on the GPU, read from a stand-in NVML: only processes outside our tree that kept SMs busy."""
import os
import sys
import types

import pytest

from labkit.core import gpu_neighbours as gn
from labkit.core.contention import ShareMeter


def fake_nvml(holders, busy, device_busy=50, raise_busy=None):
    """A pynvml stand-in: ``holders`` pid -> bytes on GPU 0, ``busy`` pid -> SM %."""
    class NVMLError(Exception):
        pass

    proc = types.SimpleNamespace
    mod = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [proc(pid=p, usedGpuMemory=m) for p, m in holders.items()],
        nvmlDeviceGetUtilizationRates=lambda h: proc(gpu=device_busy),
    )

    def process_utilization(handle, since_us):
        if raise_busy:
            raise NVMLError(raise_busy)
        return [proc(pid=p, smUtil=u) for p, u in busy.items()]

    mod.nvmlDeviceGetProcessUtilization = process_utilization
    return mod


@pytest.fixture
def nvml(monkeypatch):
    def install(*args, **kwargs):
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(*args, **kwargs))
        gn.nvml_handle.cache_clear()
        gn.gpu_count.cache_clear()
    yield install
    gn.nvml_handle.cache_clear()
    gn.gpu_count.cache_clear()


def test_a_busy_process_outside_our_tree_is_a_neighbour_and_our_own_ranks_are_not(nvml):
    me, stranger, idle = os.getpid(), 4242, 4343
    nvml({me: 2**30, stranger: 3 * 2**30, idle: 2**30}, {me: 90, stranger: 37, idle: 0})
    assert gn.gpu_neighbours(0.0) == {"pid 4242 on GPU 0 (3.0 GiB)": 0.37}
    assert gn.gpu_neighbours(0.0, exclude={me, stranger}) == {}


def test_without_per_process_figures_a_holder_on_a_busy_gpu_counts_and_on_an_idle_one_does_not(nvml):
    nvml({4242: 2**30}, {}, device_busy=80, raise_busy="Not Supported")
    assert gn.gpu_neighbours(0.0) == {"pid 4242 on GPU 0 (1.0 GiB)": 0.8}
    nvml({4242: 2**30}, {}, device_busy=0, raise_busy="Not Supported")
    assert gn.gpu_neighbours(0.0) == {}
    nvml({4242: 2**30}, {}, device_busy=80, raise_busy="Not Found")     # NVML: no kernel ran in the window
    assert gn.gpu_neighbours(0.0) == {}


def test_no_nvml_means_no_neighbours_and_the_meter_still_measures_the_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)                     # import fails: a CPU-only machine
    gn.gpu_count.cache_clear()
    gn.nvml_handle.cache_clear()
    try:
        assert gn.gpu_count() == 0 and gn.gpu_neighbours(0.0) == {}
        with ShareMeter() as meter:
            sum(range(10_000))
        assert meter.gpu_neighbours == {} and 0 < meter.share <= 1
    finally:
        gn.gpu_count.cache_clear()
        gn.nvml_handle.cache_clear()


def test_the_meter_names_the_neighbour_that_computed_while_it_measured(nvml):
    nvml({4242: 2**30}, {4242: 55})
    with ShareMeter() as meter:
        pass
    assert meter.gpu_neighbours == {"pid 4242 on GPU 0 (1.0 GiB)": 0.55}
