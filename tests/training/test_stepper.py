"""One timed training step and the end-of-run probe (FLOPs and memory at the run's batch)."""
import torch

from labkit.core.data import make_loader, synthetic_data
from labkit.core.device import get_device
from labkit.core.models import SmallCNN
from labkit.training.config import TrainConfig
from labkit.training.loop import make_optimizer, train
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
    stepper = Stepper(model, make_optimizer(model, cfg), cfg, DEVICE)
    stepper.last_inputs = torch.randn(8, *SHAPE, device=DEVICE)
    flops, mem = stepper.probe()
    assert flops > 0 and mem.batch_size == 8
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_step_returns_five_marks_and_runs_under_the_configs_autocast():
    torch.manual_seed(0)
    model = SmallCNN(10, width=4).to(DEVICE)
    cfg = TrainConfig(steps=1, amp_dtype="bf16" if DEVICE.type == "cpu" else None)
    stepper = Stepper(model, make_optimizer(model, cfg), cfg, DEVICE)
    x, y = next(iter(loader()))
    phases = stepper.step(0, (x, y))
    assert len(phases["marks"]) == 5 and phases["samples"] == 8 and torch.isfinite(phases["loss"])
    assert stepper.last_inputs.shape == (8, *SHAPE) and all(p.grad is None for p in model.parameters())
    with stepper._autocast():
        out = model(stepper.last_inputs)
    assert out.dtype == (torch.bfloat16 if cfg.amp_dtype == "bf16" else torch.float32)
