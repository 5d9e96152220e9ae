"""torch's context_parallel beside the hand-written ring: the guard says NOT CHECKED with its reason where it cannot
run (no CUDA, too few GPUs, no API), never launches then; with GPUs faked it launches NCCL ranks and judges their
error; on a machine with 2+ GPUs it really runs."""
import pytest
import torch

from labkit.parallel.context import torch_cp as cp


def _no_launch(*args, **kwargs):
    raise AssertionError("launched ranks although the guard said it cannot run")


def test_without_cuda_it_says_why_and_launches_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cp, "launch", _no_launch)
    result = cp.compare_torch_cp(world_size=2)
    assert not result.ran and not result.agrees and result.max_error is None
    assert "no CUDA GPU" in result.reason and "sharding strategy" in result.reason


def test_too_few_gpus_and_a_missing_api_each_get_a_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cp.torch_cp_unavailable(2) == "2 context-parallel ranks need 2 GPUs (NCCL: one GPU per rank), 1 visible"
    monkeypatch.setattr(cp, "_torch_cp_api", lambda: None)
    assert "has no torch.distributed.tensor.experimental.context_parallel" in cp.torch_cp_unavailable(2)


def test_the_ring_size_follows_the_gpus_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert cp.cp_world_size() == 4 and cp.cp_world_size(8) == 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cp.cp_world_size() == 2


def test_the_api_imports_on_this_torch():
    assert cp._torch_cp_api() is not None, torch.__version__


def test_bad_input_gets_one_clear_message(monkeypatch):
    with pytest.raises(ValueError, match="at least 2 ranks"):
        cp.torch_cp_unavailable(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    with pytest.raises(ValueError, match="multiple of 2 x world_size"):
        cp.compare_torch_cp(world_size=4, seq_len=20)


@pytest.mark.parametrize("error, agrees", [(3e-7, True), (2e-2, False)])
def test_with_gpus_it_launches_nccl_ranks_and_judges_their_error(monkeypatch, error, agrees):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    calls = []

    def fake_launch(fn, world_size, args, backend, timeout_s, show_output):
        calls.append((fn, world_size, backend, timeout_s))
        return [{"rank": r, "local_tokens": args[1] // world_size, "max_error": error * (r + 1) / 2,
                 "torch": "x"} for r in range(world_size)]

    monkeypatch.setattr(cp, "launch", fake_launch)
    result = cp.compare_torch_cp(world_size=2, seq_len=64, timeout_s=30)
    assert calls == [(cp.torch_cp_job, 2, "nccl", 30)]
    assert result.ran and result.max_error == error and result.agrees is agrees
    assert "32 tokens per rank" in result.detail


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_on_two_gpus_torch_cp_equals_the_ring():
    result = cp.compare_torch_cp(world_size=2, seq_len=256, timeout_s=180)
    assert result.ran and result.agrees, result
