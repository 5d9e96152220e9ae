"""Tests for labkit.memory.saved: the one saved-tensor hook counts each storage once, parameters and inputs out."""
from __future__ import annotations

import torch
from torch import nn

from labkit.memory.saved import SavedStorages, storage_bytes, storage_key, watch_saved


def test_saved_storages_count_each_storage_once_and_leave_out_what_existed_before():
    layer = nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)
    saved = SavedStorages(exclude=[*layer.parameters(), x])
    with watch_saved(saved.on_save):
        y = torch.relu(layer(x))
    # relu saves its output (4 x 16 fp32); linear saves x (excluded) and its weight (excluded)
    assert saved.total_bytes == 4 * 16 * 4
    y.sum().backward()                      # the hook hands back detached handles: backward still works
    assert layer.weight.grad is not None


def test_views_are_one_storage_and_meta_tensors_have_a_key():
    t = torch.zeros(10)
    assert storage_key(t[2:]) == storage_key(t) and storage_bytes(t[2:]) == 40 and storage_bytes("x") == 0
    with torch.device("meta"):
        a, b = torch.empty(3), torch.empty(3)
    assert storage_key(a) and storage_key(a) != storage_key(b)


def test_on_free_hears_of_each_saved_tensor_once_autograd_lets_it_go():
    layer, x = nn.Linear(8, 16), torch.randn(4, 8)
    saved, freed = [], []
    with watch_saved(saved.append, freed.append):
        y = torch.tanh(layer(x))
    assert len(saved) >= 2 and freed == []                   # the graph holds them: nothing released yet
    y.sum().backward()                                       # backward frees the graph's saved tensors
    assert len(freed) == len(saved)
    assert {storage_key(t) for t in freed} == {storage_key(t) for t in saved}
