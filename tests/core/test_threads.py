"""Intra-op threads matched to the free CPUs: chosen from measured idleness, restored afterwards."""
import pytest
import torch

from labkit.core import threads
from labkit.core.contention import spinning_cores
from labkit.core.machine import affinity_cpu_count, cpu_count


@pytest.mark.parametrize("allowed, idle, expected", [
    (2, 2.0, 2), (2, 1.0, 1),          # quiet 2-core box; one core busy
    (2, 1.4, 1), (2, 1.5, 2),          # rounded half up: a half-busy neighbour keeps the thread
    (2, 0.0, 1),                       # never fewer than one
    (2, 7.9, 2),                       # a big host under a 2-CPU quota: the quota caps it
])
def test_free_cpu_count(allowed, idle, expected):
    assert threads.free_cpu_count(allowed=allowed, idle=idle) == (expected, idle)


def test_matched_threads_sets_the_pool_for_the_block_and_restores_it(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "idle_cpus", lambda window_s: 0.2)
    with threads.matched_threads("cpu") as fit:
        assert torch.get_num_threads() == fit.threads == 1 and fit.before == before
    assert torch.get_num_threads() == before
    assert "intra-op threads: 1 of the" in fit.describe() and "0.2 of them idle" in fit.describe()
    with pytest.raises(RuntimeError), threads.matched_threads("cpu"):
        raise RuntimeError("the block failed")
    assert torch.get_num_threads() == before


def test_a_gpu_run_keeps_the_pool(monkeypatch):
    monkeypatch.setattr(threads, "idle_cpus", lambda window_s: pytest.fail("a GPU run must not measure"))
    with threads.matched_threads("cuda") as fit:
        assert fit.idle is None and torch.get_num_threads() == fit.before
    assert "GPU" in fit.describe()


@pytest.mark.skipif(cpu_count() < 2, reason="needs 2 CPUs: one busy, one free")
@pytest.mark.skipif(affinity_cpu_count() > cpu_count(),
                    reason="the CPU quota is tighter than the affinity mask (as on Binder): idle host CPUs "
                           "outside the quota read as free, so a spinner on one of them need not cost a thread")
def test_a_busy_core_is_measured_as_not_free():
    """Real load: a process spinning on a core must cost the pool a thread (never more than the free CPUs)."""
    with spinning_cores(1):
        free, idle = threads.free_cpu_count(window_s=0.5)
    assert free <= cpu_count() - 1, f"{idle:.2f} CPUs measured idle with one of {cpu_count()} spinning"
