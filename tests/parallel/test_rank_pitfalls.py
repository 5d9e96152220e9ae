"""Rank-level pitfalls on the PyTorch side: saving a wrapped model, rank 0's extra work (real processes)."""
import pytest
import torch

from labkit.core.models import MLP
from labkit.parallel.rank_pitfalls import rank0_extra_work, save_wrapped_model, torch_visible_gpus


def test_save_wrapped_model():
    torch.manual_seed(0)   # on a GPU box DataParallel moves the model to cuda:0: the evidence must not mix devices
    ev = save_wrapped_model(MLP(10, in_features=12, hidden=8), torch.randn(3, 12), MLP(10, in_features=12, hidden=8))
    assert ev.wrapped_keys_sample[0].startswith("module.")
    assert "Missing key" in ev.broken_error and ev.fixed_max_abs_diff == 0.0
    assert "Weights only load failed" in ev.pickled_model_error


def test_rank0_extra_work_times_out_then_fixed():
    broken = rank0_extra_work("broken", extra_work_s=4.5, pg_timeout_s=3.0)
    assert not broken.ok and broken.failed_rank == 1 and "Timed out" in broken.error
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
