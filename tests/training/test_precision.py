"""Mixed precision in torch: the loss-scaling arithmetic and autocast measurements."""
import pytest
import torch

from labkit.core.models import MLP
from labkit.memory.model import saved_activation_bytes
from labkit.training.precision import autocast_step, fp16_underflow


def test_fp16_underflow_and_scaling_recovers():
    ev = fp16_underflow(-10, -2, 81, scale=2.0 ** 16)
    assert ev.fp16_zero_fraction > 0.2           # 1e-10 .. ~3e-8 flush to zero in fp16
    assert ev.scaled_zero_fraction < ev.fp16_zero_fraction
    assert ev.unscaled_max_rel_error < 1e-2 and ev.bf16_zero_fraction == 0.0
    assert float(torch.tensor(1e-8).half()) == 0.0 and float(torch.tensor(1e-8 * 2 ** 16).half()) > 0


def test_fp16_scale_overflow_is_an_error():
    with pytest.raises(ValueError, match="overflows"):
        fp16_underflow(-4, 0, 5, scale=2.0 ** 20)


def test_bf16_saves_fewer_activation_bytes():
    """At a real batch size activations dominate; at batch 8 the bf16 weight copies autocast saves would."""
    torch.manual_seed(0)
    model, x = MLP(10, in_features=48, hidden=64), torch.randn(512, 48)
    assert saved_activation_bytes(model, x, precision="bf16") < saved_activation_bytes(model, x)


def test_autocast_step_reports_and_rejects_cpu_fp16():
    torch.manual_seed(0)
    r = autocast_step(MLP(10, in_features=3 * 8 * 8, hidden=16), 4, "bf16", image_shape=(3, 8, 8), repeats=1)
    assert r.dtype == "bf16" and r.samples_per_s > 0 and r.peak_cuda_mem_bytes is None
    with pytest.raises(ValueError, match="GPU recipe"):
        autocast_step(MLP(10, in_features=12, hidden=4), 2, "fp16", image_shape=(3, 2, 2))
    with pytest.raises(ValueError, match="dtype must be one of"):
        autocast_step(MLP(10, in_features=12, hidden=4), 2, "fp8", image_shape=(3, 2, 2))
