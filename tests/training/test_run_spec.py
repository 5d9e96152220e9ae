"""Tests for labkit.training.run_spec: one run description, checked once; what it derives gives the same run."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from labkit.core.data import make_loader, synthetic_data
from labkit.core.env import seed_everything
from labkit.core.models import build_model
from labkit.memory.model import build_memory_model
from labkit.training.config import TrainConfig
from labkit.training.loop import train
from labkit.training.run_spec import RunSpec

SHAPE = (1, 8, 8)


@pytest.mark.parametrize("field, bad, message", [
    ("model", "vgg", "model must be one of"),
    ("batch_size", 0, "batch_size must be an integer >= 1, got 0"),
    ("batch_size", 2.0, "batch_size must be an integer"),
    ("optimizer", "lamb", "optimizer must be one of"),
    ("lr", -1, "lr must be a number > 0"),
    ("momentum", 1.0, "momentum must be a number in [0, 1)"),
    ("weight_decay", -0.1, "weight_decay must be a number >= 0"),
    ("precision", "fp8", "precision must be None or one of"),
    ("channels_last", "yes", "channels_last must be True or False"),
    ("lr_warmup_steps", -1, "lr_warmup_steps must be an integer >= 0"),
    ("seed", -1, "seed must be an integer >= 0"),
])
def test_each_bad_field_gets_one_clear_error(field, bad, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        RunSpec(**{field: bad})


def test_a_batch_larger_than_the_dataset_names_the_dataset():
    with pytest.raises(ValueError, match=r"between 1 and 100.*dataset \(100 samples\)"):
        RunSpec(batch_size=128, dataset_size=100)
    with pytest.raises(ValueError, match="batch_size must be an integer between 1 and 100"):
        RunSpec(batch_size=8, dataset_size=100).replace(batch_size=101)     # a copy is checked again


def test_precision_has_one_spelling_and_reaches_the_step_and_the_loop():
    spec = RunSpec(precision="bfloat16", channels_last=True)
    assert spec.precision == "bf16" and RunSpec(precision="fp32").precision is None
    assert spec.step_options().precision == "bf16" and spec.step_options().channels_last
    cfg = TrainConfig(run=spec, steps=3)
    assert cfg.spec.step_options() == spec.step_options()
    assert RunSpec(precision=torch.bfloat16).precision == "bf16"


def test_the_loop_trains_the_runs_optimizer_and_refuses_a_loader_of_another_batch():
    spec = RunSpec(model="mlp", batch_size=16, optimizer="adam", lr=0.01, momentum=0.0, weight_decay=1e-4,
                   lr_warmup_steps=3, seed=7)
    opt = spec.build_optimizer(torch.nn.Linear(2, 2))
    assert isinstance(opt, torch.optim.Adam) and opt.defaults["lr"] == 0.01 and opt.defaults["weight_decay"] == 1e-4
    sgd = RunSpec(momentum=0.5).build_optimizer(torch.nn.Linear(2, 2))
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.5
    assert spec.replace(seed=7) == spec and dataclasses.replace(spec) == spec
    data = synthetic_data(n_train=64, n_val=16, image_shape=SHAPE)
    cfg = TrainConfig(run=spec, steps=2, progress=False, evaluate=False, profile_model=False)
    with pytest.raises(ValueError, match="loader yields batches of 8 but the config's run says batch_size=16"):
        train(build_model("mlp", data.num_classes, SHAPE), make_loader(data.train, 8), cfg)
    assert len(train(build_model("mlp", data.num_classes, SHAPE), spec.loader(data.train), cfg).steps) == 2
    assert (spec.optimizer_kind, RunSpec(momentum=0.0).optimizer_kind, RunSpec().optimizer_kind) == \
        ("adam", "sgd", "sgd_momentum")


def test_the_memory_model_it_builds_is_the_one_the_old_call_built():
    net = build_model("small_cnn", 10, SHAPE)
    old = build_memory_model(net, SHAPE, "sgd", 0.9).predict(8)
    assert RunSpec(batch_size=8).memory_model(net, SHAPE).predict(8) == old


def test_the_old_entry_point_and_the_spec_give_identical_losses():
    """Same seeds -> same losses: the loader made by hand, and made by the RunSpec the config trains."""
    data = synthetic_data(n_train=64, n_val=16, image_shape=SHAPE)
    spec = RunSpec(model="mlp", batch_size=8, lr=0.05, lr_warmup_steps=2, seed=3, dataset_size=len(data.train))

    def losses(loader, cfg):
        seed_everything(3)
        model = build_model("mlp", data.num_classes, SHAPE)
        return [r.loss for r in train(model, loader, cfg).steps]

    measure = dict(steps=6, device="cpu", progress=False, evaluate=False, profile_model=False, warmup_steps=1)
    by_hand = losses(make_loader(data.train, 8, shuffle=True, seed=3),
                     TrainConfig(run=RunSpec(lr=0.05, momentum=0.9, lr_warmup_steps=2, seed=3, batch_size=8), **measure))
    derived = losses(spec.loader(data.train), TrainConfig(run=spec, **measure))
    assert by_hand == derived and len(by_hand) == 6


def test_tf32_is_part_of_the_run_and_the_loop_applies_it():
    """Issue 50: TF32 lives in the run's description; the loop runs fp32 math as the run says and restores
    torch's setting after (None leaves it alone)."""
    import torch

    from labkit.training.flops import fp32_math_of

    with pytest.raises(ValueError, match="tf32 must be True, False or None"):
        RunSpec(tf32="yes")
    flag = torch.backends.cuda.matmul
    before = flag.fp32_precision
    with fp32_math_of(RunSpec(tf32=True)):
        assert flag.fp32_precision == "tf32"
    with fp32_math_of(RunSpec(tf32=False)):
        assert flag.fp32_precision == "ieee"
    with fp32_math_of(RunSpec()):
        assert flag.fp32_precision == before
    assert flag.fp32_precision == before
