"""Baselines for GPU peaks: other code's tensors are subtracted, this work's own tensors are kept."""
import pytest
import torch
from torch import nn

from labkit.memory import device as dm


def test_work_bytes_count_params_grads_buffers_optimizer_state_and_batch():
    model = nn.Sequential(nn.Linear(10, 20), nn.BatchNorm1d(20))        # 220 + 40 params, 40 + 1 buffers
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 10)
    model(x).sum().backward()
    opt.step()
    params = 4 * 260
    buffers = 4 * 40 + 8                                                 # running mean/var + int64 counter
    assert dm.work_bytes_on(torch.device("cpu"), model) == params + params + buffers
    assert dm.work_bytes_on(torch.device("cpu"), model, opt, (x,)) == 3 * params + buffers + 4 * 80
    assert dm.optimizer_state_bytes(opt) == params
    assert dm.work_bytes_on(torch.device("meta"), model, opt, (x,)) == 0   # nothing of it on that device


def test_baseline_subtracts_other_cells_and_keeps_the_model(monkeypatch):
    """The H100 bug: a 500 MB tensor from an earlier cell was counted in the step's peak."""
    model = nn.Linear(1000, 1000)                                        # 4,004,000 bytes, on the CPU here
    other_cells = 500 * 2**20
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: other_cells)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: other_cells + 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: other_cells + 8 * 2**20)
    cuda = torch.device("cuda")
    baseline = dm.baseline_bytes(cuda, model)
    assert baseline == other_cells                                       # the model is not on the GPU yet
    assert dm.peak_since(cuda, baseline) == (3 * 2**20, other_cells + 8 * 2**20)
    monkeypatch.setattr(dm, "work_bytes_on", lambda *a, **k: 4_004_000)    # the model already on the GPU
    assert dm.baseline_bytes(cuda, model) == other_cells - 4_004_000


def test_no_baseline_on_a_cpu():
    assert dm.baseline_bytes(torch.device("cpu"), nn.Linear(2, 2)) == 0


@pytest.mark.parametrize("tensors, expected", [((), 0), ((torch.zeros(3), None, torch.zeros(2, dtype=torch.int64)), 28)])
def test_tensor_bytes(tensors, expected):
    assert dm.tensor_bytes(*tensors) == expected
