"""The one backend rule (NCCL only with one GPU per rank), exercised with a mocked device count; data-size checks."""
from __future__ import annotations

import pytest

from labkit.comm import backend as bk


@pytest.mark.parametrize("count,world_size,local,expected", [
    (0, 2, None, "gloo"), (1, 2, None, "gloo"), (1, 1, None, "nccl"), (2, 2, None, "nccl"),
    (8, 8, None, "nccl"), (4, 8, None, "gloo"), (4, 8, 4, "nccl"),   # 2 nodes x 4 GPUs: one GPU per local rank
])
def test_auto_backend_is_nccl_only_with_one_gpu_per_rank(gpus, count, world_size, local, expected):
    gpus(count)
    choice = bk.choose_backend(world_size, "auto", local_world_size=local)
    assert choice.backend == expected and choice.uses_gpus == (expected == "nccl")
    assert choice.reason.startswith("NCCL" if expected == "nccl" else "gloo")


def test_two_ranks_on_one_gpu_say_they_are_cpu_processes(gpus):
    gpus(1)
    choice = bk.choose_backend(2)
    assert choice.reason == ("gloo: 2 ranks but only 1 GPU(s) (NCCL needs one GPU per rank), so every rank is a "
                             "CPU process and these timings are CPU timings")


@pytest.mark.parametrize("count,backend,expected", [
    (0, "auto", "CPU process; messages: gloo over loopback TCP"), (1, "auto", "CPU timings; messages: gloo over loopback"),
    (2, "auto", "one GPU per rank; messages: NCCL between the GPUs"), (2, "gloo", "gloo as requested"),
])
def test_where_ranks_run_follows_the_live_device_count(gpus, count, backend, expected):
    gpus(count)
    line = bk.where_ranks_run(2, backend, what="replicas")
    assert line.startswith("2 replicas -> ") and expected in line


def test_gpus_without_nccl_fall_back_to_gloo(gpus):
    gpus(2, nccl=False)
    assert bk.choose_backend(2).reason == "gloo: 2 GPU(s) but this torch build has no NCCL, so every rank is a CPU process"
    with pytest.raises(ValueError, match=r"^backend='nccl' needs one CUDA GPU per rank: 2 rank\(s\) on this node "
                                         r"but 2 GPU\(s\) visible \(NCCL available: False\)"):
        bk.choose_backend(2, "nccl")


def test_more_ranks_than_samples_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 3, got 4; the dataset has 3 "
                                         r"samples, so each rank needs at least one; use fewer ranks$"):
        bk.check_data_size(4, 3)
    bk.check_data_size(3, 3)


# ---- the one world-size check: the validator, then the launcher's own limit
@pytest.mark.parametrize("world_size", [0, -1, 2.0, "2", True, None])
def test_world_size_must_be_a_positive_integer(world_size):
    with pytest.raises(ValueError, match=r"^world_size must be an integer >= 1, got"):
        bk.check_world_size(world_size)


def test_world_size_within_the_launchers_limit(monkeypatch):
    monkeypatch.setattr(bk, "cpu_count", lambda: 2)
    assert bk.world_size_limit("gloo")[0] == bk.GLOO_RANKS_PER_CORE * 2
    assert bk.world_size_limit("nccl") is None
    assert bk.check_world_size(8, bk.world_size_limit("gloo")) == 8
    assert bk.check_world_size(1000, bk.world_size_limit("nccl")) == 1000
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 8, got 9; gloo runs at most "
                                         r"4 processes per CPU core x 2 cores here"):
        bk.check_world_size(9, bk.world_size_limit("gloo"))
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 3, got 4; why$"):
        bk.check_world_size(4, (3, "why"))


def test_retired_spellings_read_from_this_pytorch():
    """torch 2.14: dist.reduce_op still exists and warns toward ReduceOp; the modern form is silent; no tcp backend."""
    from labkit.comm.backend import retired_spellings

    old = retired_spellings()
    if old.reduce_op_present:
        assert old.reduce_op_same_operation and any("ReduceOp" in w for w in old.reduce_op_warnings)
    assert old.modern_warnings == () and "tcp" not in old.backends and "gloo" in old.backends
