"""FLOP counting against hand-worked numbers; peak table lookups; MFU; unknown devices."""
import pytest
import torch
from torch import nn

from labkit.flops import PEAK_TABLE, count_training_flops, find_peak, flops_per_sample, mfu, normalise_dtype, peak_flops_per_s


def test_linear_training_flops_by_hand():
    # forward 2*B*i*o per matmul; backward: grad-weight 2*B*i*o for both layers, grad-input only for the
    # second layer (the input needs no grad). Two Linear layers without bias: 12->8->4, B=5.
    model = nn.Sequential(nn.Linear(12, 8, bias=False), nn.ReLU(), nn.Linear(8, 4, bias=False))
    B = 5
    fwd = 2 * B * (12 * 8 + 8 * 4)
    bwd = 2 * B * (12 * 8 + 8 * 4) + 2 * B * 8 * 4
    assert count_training_flops(model, torch.randn(B, 12), torch.zeros(B, dtype=torch.long)) == fwd + bwd
    assert flops_per_sample(model, (12,), batch_size=B) == pytest.approx((fwd + bwd) / B)


def test_flops_per_sample_is_batch_independent_and_leaves_no_grads():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    rm = model[1].running_mean.clone()
    assert flops_per_sample(model, (3, 8, 8), 2) == pytest.approx(flops_per_sample(model, (3, 8, 8), 6))
    assert all(p.grad is None for p in model.parameters()) and torch.equal(rm, model[1].running_mean)


def test_peak_table_lookup_and_unknowns():
    assert find_peak("NVIDIA A100-SXM4-80GB").name == "NVIDIA A100"
    assert find_peak("NVIDIA H100 80GB HBM3").name == "NVIDIA H100 SXM"
    assert find_peak("NVIDIA H100 PCIe").name == "NVIDIA H100 PCIe"
    assert find_peak("Tesla T4").name == "NVIDIA T4"
    assert find_peak("NVIDIA GeForce GTX 1080") is None
    assert all(spec.source for spec in PEAK_TABLE)
    a100 = find_peak("NVIDIA A100-PCIE-40GB")
    assert a100.peak_flops_per_s["bfloat16"] == 312e12 and a100.peak_flops_per_s["float32"] == 19.5e12
    peak, note = peak_flops_per_s("cpu", "bf16")
    assert peak is None and "unknown" in note


def test_mfu_and_dtypes():
    assert mfu(50e12, 100e12) == pytest.approx(0.5)
    assert mfu(None, 1.0) is None and mfu(1.0, None) is None
    assert normalise_dtype("bf16") == "bfloat16" and normalise_dtype(torch.float16) == "float16"
    assert normalise_dtype(None) == "float32"
    with pytest.raises(ValueError, match="unknown dtype"):
        normalise_dtype("fp8")
