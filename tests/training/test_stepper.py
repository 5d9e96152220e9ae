"""One timed training step and the end-of-run probe (FLOPs and memory at the run's batch)."""
import pytest
import torch

from labkit.core.data import make_loader, synthetic_data
from labkit.core.device import get_device
from labkit.core.models import SmallCNN
from labkit.training.config import TrainConfig
from labkit.training.loop import train
from labkit.training.run_spec import RunSpec
from labkit.training.stepper import Stepper

SHAPE = (3, 8, 8)
DEVICE = get_device()


def loader(bs=8):
    return make_loader(synthetic_data(n_train=64, n_val=32, image_shape=SHAPE).train, bs, shuffle=True)


def test_end_of_run_probe_has_no_side_effects_on_batchnorm():
    model = SmallCNN(10, width=4)
    cfg = TrainConfig(steps=2, progress=False, evaluate=False, profile_model=False)
    train(model, loader(), cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stepper = Stepper(model, cfg.spec.build_optimizer(model), cfg, DEVICE)
    stepper.last_inputs = torch.randn(8, *SHAPE, device=DEVICE)
    flops, mem = stepper.probe()
    assert flops > 0 and mem.batch_size == 8
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_step_returns_five_marks_and_runs_under_the_configs_autocast():
    torch.manual_seed(0)
    model = SmallCNN(10, width=4).to(DEVICE)
    cfg = TrainConfig(steps=1, run=RunSpec(precision="bf16" if DEVICE.type == "cpu" else None))
    stepper = Stepper(model, cfg.spec.build_optimizer(model), cfg, DEVICE)
    x, y = next(iter(loader()))
    marks, loss, samples = stepper.step(0, (x, y))
    assert len(marks) == 5 and samples == 8 and torch.isfinite(loss)
    assert stepper.last_inputs.shape == (8, *SHAPE) and all(p.grad is None for p in model.parameters())
    with stepper._autocast():
        out = model(stepper.last_inputs)
    assert out.dtype == (torch.bfloat16 if cfg.spec.precision == "bf16" else torch.float32)


def test_whole_step_timing_marks_once_and_leaves_the_phases_untimed():
    """timing='step': one mark a step (the cheap instrument for launch-bound GPU steps), the phases NaN."""
    import math

    model = SmallCNN(10, width=4).to(DEVICE)
    cfg = TrainConfig(steps=3, timing="step", progress=False, evaluate=False, profile_model=False)
    stepper = Stepper(model, cfg.spec.build_optimizer(model), cfg, DEVICE)
    marks, loss, samples = stepper.step(0, next(iter(loader())))
    assert len(marks) == 1 and samples == 8 and torch.isfinite(loss)
    res = train(SmallCNN(10, width=4), loader(), cfg)
    assert all(math.isnan(r.forward_s) and math.isnan(r.data_wait_s) and r.step_time_s > 0 for r in res.steps)
    assert math.isnan(res.data_wait_fraction) and res.extra["timed"] == "step"
    with pytest.raises(ValueError, match="timing must be one of"):
        TrainConfig(steps=1, timing="per-phase")
