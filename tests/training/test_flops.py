"""FLOP counting against hand-worked numbers; peak table lookups; MFU; unknown devices."""
import pytest
import torch
from torch import nn

from labkit.training import flops
from labkit.training.flops import (PEAK_TABLE, active_math_mode, checked_mfu, count_training_flops, find_peak,
                                   flops_per_sample, mfu, peak_flops_per_s)


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
    assert a100.peak_flops_per_s["bf16"] == 312e12 and a100.peak_flops_per_s["fp32"] == 19.5e12   # keyed by math mode
    peak, note = peak_flops_per_s("cpu", "bf16")
    assert peak is None and "unknown" in note


def test_mfu():
    assert mfu(50e12, 100e12) == pytest.approx(0.5)
    assert mfu(None, 1.0) is None and mfu(1.0, None) is None



# ---------------------------------------------------------------------------- math mode and the peak it implies
@pytest.fixture()
def fake_gpu(monkeypatch):
    """A CUDA device of a chosen name and compute capability (mocked)."""
    state = {"name": "NVIDIA H100 80GB HBM3", "cc": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: state["name"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: state["cc"])
    return state


def _set_precision(monkeypatch, matmul, conv):
    """Mock torch's new-API getters (the real ones would change the process-wide settings)."""
    monkeypatch.setattr(flops, "_tf32_enabled", lambda: "tf32" in (matmul, conv))


def test_math_mode_follows_autocast_and_device():
    assert active_math_mode("cpu") == "fp32" and active_math_mode("cpu", "bf16") == "bf16"
    assert active_math_mode("cuda:0", torch.float16) == "fp16"


@pytest.mark.parametrize("cc, matmul, conv, expected", [
    ((9, 0), "ieee", "tf32", "tf32"),      # torch's default: cuDNN convolutions on TF32, matmuls strict
    ((9, 0), "tf32", "ieee", "tf32"),
    ((9, 0), "ieee", "ieee", "fp32"),      # both forced strict
    ((8, 0), "ieee", "tf32", "tf32"),      # A100: TF32 exists from compute capability 8.0
    ((7, 0), "tf32", "tf32", "fp32"),      # V100: no TF32 tensor cores, whatever the flags say
])
def test_tf32_detection_by_capability_and_flags(fake_gpu, monkeypatch, cc, matmul, conv, expected):
    fake_gpu["cc"] = cc
    _set_precision(monkeypatch, matmul, conv)
    assert active_math_mode("cuda:0") == expected


def test_tf32_flags_read_through_the_current_api(monkeypatch):
    """PyTorch 2.9+: fp32_precision per backend; 'none' falls back to the older flags."""
    class Ns:
        pass

    matmul, conv = Ns(), Ns()
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends.cudnn, "conv", conv, raising=False)
    matmul.fp32_precision, conv.fp32_precision = "ieee", "tf32"
    assert flops._tf32_enabled() is True
    conv.fp32_precision = "ieee"
    assert flops._tf32_enabled() is False
    matmul.fp32_precision, conv.fp32_precision = "none", "none"
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert flops._tf32_enabled() is True                     # older flag: cuDNN TF32 on by default
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert flops._tf32_enabled() is False
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert flops._tf32_enabled() is True


def test_current_torch_defaults_mean_tf32_convolutions():
    """Not mocked: this torch's own defaults let cuDNN convolutions use TF32 (the H100's 55-93% MFU bug)."""
    assert torch.backends.cudnn.conv.fp32_precision in ("tf32", "none")
    assert flops._tf32_enabled() is True


@pytest.mark.parametrize("name, mode, tflops", [
    ("NVIDIA H100 80GB HBM3", "tf32", 494.5), ("NVIDIA H100 80GB HBM3", "fp32", 67),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5), ("NVIDIA H100 PCIe", "tf32", 378),
    ("NVIDIA H200", "bf16", 989.5), ("NVIDIA A100-SXM4-80GB", "tf32", 156),
    ("NVIDIA L4", "bf16", 121), ("NVIDIA L40S", "tf32", 183), ("Tesla V100-SXM2-16GB", "fp16", 125),
    ("Tesla V100-PCIE-32GB", "fp32", 14), ("Tesla T4", "fp16", 65),
])
def test_peak_per_gpu_and_math_mode(fake_gpu, name, mode, tflops):
    fake_gpu["name"] = name
    peak, note = peak_flops_per_s("cuda:0", mode)
    assert peak == pytest.approx(tflops * 1e12)
    assert f"{mode} dense peak {tflops:g} TFLOP/s" in note and "datasheet" in note


def test_no_peak_for_a_mode_the_gpu_lacks_or_an_unlisted_gpu(fake_gpu):
    fake_gpu["name"] = "Tesla T4"
    assert peak_flops_per_s("cuda:0", "bf16") == (None, "NVIDIA T4: the datasheet gives no bf16 peak: no MFU")
    fake_gpu["name"] = "NVIDIA GeForce GTX 1080"
    peak, note = peak_flops_per_s("cuda:0", "fp32")
    assert peak is None and "not in labkit.training.flops.PEAK_TABLE" in note
    assert find_peak("NVIDIA L40S").name == "NVIDIA L40S" and find_peak("NVIDIA L4").name == "NVIDIA L4"


def test_every_peak_is_dense_and_ordered():
    for spec in PEAK_TABLE:
        p = spec.peak_flops_per_s
        assert p["fp32"] > 0 and "datasheet" in spec.source
        if "tf32" in p:
            assert p["fp32"] <= p["tf32"] < p["bf16"] == p["fp16"]


def test_mfu_cannot_exceed_100_percent():
    assert checked_mfu(50e12, 100e12) == pytest.approx(0.5)
    with pytest.warns(RuntimeWarning, match=r"150% of the peak used \(H100 fp32 67\): that peak is too low"):
        assert checked_mfu(100.5e12, 67e12, "H100 fp32 67") == 1.0


# ---------------------------------------------------------------------------- the recorded H100 run
def test_recorded_h100_fp32_rungs_ran_tf32_and_stay_under_its_peak(fake_gpu, monkeypatch):
    """The H100 bug: fp32 ResNet-18 rungs read 50%+ 'MFU' against the fp32 peak because cuDNN ran TF32."""
    import json
    from pathlib import Path

    from labkit.core.models import build_model

    ref = json.loads((Path(__file__).resolve().parents[2] / "data" / "recorded_h100_reference.json").read_text())
    fake_gpu["name"] = ref["device"]
    _set_precision(monkeypatch, "tf32" if ref["matmul_allow_tf32"] else "ieee",
                   "tf32" if ref["cudnn_allow_tf32"] else "ieee")
    assert active_math_mode("cuda:0") == "tf32"
    per_sample = flops_per_sample(build_model("resnet18"), (3, 32, 32))
    for row in ref["throughput_gpu_resident"]:
        if not isinstance(row["samples_per_s"], (int, float)):
            continue                                            # a recipe that errored on the H100
        mode = "bf16" if row["amp"] else ("tf32" if row["tf32"] else "fp32")    # each row's own math
        peak, _ = peak_flops_per_s("cuda:0", mode)
        assert 0 < mfu(per_sample * row["samples_per_s"], peak) <= 1.0, row
    by_math = {("tf32" if r["tf32"] else "fp32"): r["samples_per_s"] for r in ref["throughput_gpu_resident"]
               if r["batch"] == 512 and not r["amp"] and not r["cl"]}
    assert by_math["tf32"] / by_math["fp32"] > 2.5              # the TF32 lesson: 2.7x over strict fp32 at batch 512
    fastest_fp32 = max(r["samples_per_s"] for r in ref["throughput_gpu_resident"] if not r["amp"])
    fp32_peak, _ = peak_flops_per_s("cuda:0", "fp32")
    assert mfu(per_sample * fastest_fp32, fp32_peak) > 0.4      # what the wrong peak made it look like


def test_training_rate_is_peak_times_measured_mfu():
    """The explorer's default rate: a real training step's counted FLOPs over its time (no MFU on a CPU)."""
    rate, note = flops.measured_training_flops_per_s("cpu", model="small_cnn", batch_size=8, repeats=2)
    assert 1e6 < rate < 1e13 and "small_cnn training step, batch 8" in note and "no MFU" in note
