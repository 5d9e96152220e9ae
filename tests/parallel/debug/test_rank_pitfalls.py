"""Rank-level pitfalls on the PyTorch side: saving a wrapped model, rank 0's extra work (real processes)."""
import pytest
import torch
import torch.distributed as dist

from labkit.comm.launch import RankFailedError
from labkit.core.models import MLP
from labkit.parallel.debug import rank_pitfalls
from labkit.parallel.debug.rank_pitfalls import rank0_extra_work, save_wrapped_model, torch_visible_gpus


def test_save_wrapped_model():
    torch.manual_seed(0)   # on a GPU box DataParallel moves the model to cuda:0: the evidence must not mix devices
    ev = save_wrapped_model(MLP(10, in_features=12, hidden=8), torch.randn(3, 12), MLP(10, in_features=12, hidden=8))
    assert ev.wrapped_keys_sample[0].startswith("module.")
    assert "Missing key" in ev.broken_error and ev.fixed_max_abs_diff == 0.0
    assert "Weights only load failed" in ev.pickled_model_error


def test_rank0_extra_work_times_out_then_fixed():
    broken = rank0_extra_work("broken", extra_work_s=4.5, pg_timeout_s=3.0)
    assert not broken.ok and broken.failed_rank == 1 and "Timed out" in broken.error and broken.timed_out
    assert broken.backend == "gloo" and broken.backend_reason.startswith("gloo")
    fixed = rank0_extra_work("all_ranks", extra_work_s=1.0, pg_timeout_s=3.0)
    assert fixed.ok and fixed.all_reduce_result == [3.0] * 4
    with pytest.raises(ValueError, match="variant"):
        rank0_extra_work("sometimes")


def test_rank0_extra_work_checks_before_launching():
    with pytest.raises(ValueError, match=r"^world_size must be an integer >= 2, got 1; rank 0's extra work"):
        rank0_extra_work("broken", world_size=1)
    with pytest.raises(ValueError, match=r"^extra_work_s must be a number > 0, got 0"):
        rank0_extra_work("broken", extra_work_s=0)


def test_an_empty_cuda_visible_devices_hides_every_gpu_in_a_fresh_process():
    hidden = torch_visible_gpus("")
    assert hidden == {"CUDA_VISIBLE_DEVICES": "", "gpus": 0, "cuda_initialized": False}


def _fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)


@pytest.mark.parametrize("count,backend", [(2, "nccl"), (1, "gloo")])
def test_rank0_extra_work_uses_nccl_only_with_a_gpu_per_rank(monkeypatch, count, backend):
    """With 2 GPUs the ranks run NCCL with blocking wait (the timeout raised where rank 1 waited); on 1 GPU gloo."""
    _fake_gpus(monkeypatch, count)
    seen = {}

    def fake_launch(fn, world_size, **kw):
        seen.update(kw)
        tb = "Traceback ...\ntorch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation timeout"
        raise RankFailedError(1, world_size, "x:y", tb, "DistBackendError")
    monkeypatch.setattr(rank_pitfalls, "launch", fake_launch)
    ev = rank0_extra_work("broken")
    assert seen["backend"] == backend and ev.backend == backend and ev.backend_reason.startswith(backend.upper()
                                                                                                   if count == 2 else "gloo")
    assert seen["env"] == ({"TORCH_NCCL_BLOCKING_WAIT": "1"} if backend == "nccl" else None)
    assert not ev.ok and ev.failed_rank == 1 and ev.timed_out and "Watchdog caught" in ev.error
