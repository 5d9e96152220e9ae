"""The instrumented training loop: timing fields, statistics, stopping, accuracy, bad input."""
import math
import statistics

import pytest
import torch

from labkit.data import make_loader, synthetic_data
from labkit.loop import RunResult, StepRecord, TrainConfig, evaluate_accuracy, train
from labkit.models import MLP, SmallCNN

SHAPE = (3, 8, 8)


@pytest.fixture(scope="module")
def data():
    return synthetic_data(n_train=64, n_val=32, image_shape=SHAPE)


def loader(data, bs=8):
    return make_loader(data.train, bs, shuffle=True)


def mlp():
    torch.manual_seed(0)
    return MLP(10, in_features=3 * 8 * 8, hidden=32)


def test_config_validation():
    with pytest.raises(ValueError, match="exactly one of steps"):
        TrainConfig()
    with pytest.raises(ValueError, match="exactly one of steps"):
        TrainConfig(steps=3, epochs=1)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(steps=3, optimizer="lamb")
    with pytest.raises(ValueError, match="amp_dtype"):
        TrainConfig(steps=3, amp_dtype="fp8")
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(steps=3, lr=0)
    assert TrainConfig.fast().steps == 10


def test_timing_fields_are_consistent(data):
    res = train(mlp(), loader(data), TrainConfig(steps=6, progress=False), val_loader=make_loader(data.val, 16))
    assert isinstance(res, RunResult) and len(res.steps) == 6
    for i, r in enumerate(res.steps):
        assert isinstance(r, StepRecord) and r.step == i and r.samples == 8
        phases = [r.data_wait_s, r.h2d_s, r.forward_s, r.backward_s, r.optimizer_s]
        assert all(p >= 0 and math.isfinite(p) for p in phases)
        assert sum(phases) <= r.step_time_s + 1e-6          # phases are disjoint parts of the step
        assert r.samples_per_s == pytest.approx(r.samples / r.step_time_s)
        assert math.isfinite(r.loss)
    steady = [r.samples_per_s for r in res.steps[2:]]        # warmup_steps=2 excluded
    assert res.samples_per_s_median == pytest.approx(statistics.median(steady))
    assert res.samples_per_s_p10 <= res.samples_per_s_median <= res.samples_per_s_p90
    assert 0.0 <= res.data_wait_fraction < 1.0
    assert 0.0 <= res.val_accuracy <= 1.0
    assert res.stopped_early is False and res.device.startswith("CPU")


def test_cpu_memory_flops_and_mfu_note(data):
    res = train(mlp(), loader(data), TrainConfig(steps=3, progress=False, evaluate=False))
    assert res.memory is not None and res.peak_mem_bytes == res.memory.total_bytes
    assert res.memory.batch_size == 8 and res.memory.optimizer_bytes == res.memory.params_bytes  # SGD momentum
    assert res.flops_per_sample > 0 and res.achieved_flops_per_s == pytest.approx(
        res.flops_per_sample * res.samples_per_s_median)
    assert res.mfu is None and "unknown" in res.mfu_note
    assert res.val_accuracy is None


def test_epochs_mode_and_dataframe(data):
    res = train(mlp(), loader(data, 16), TrainConfig(epochs=2, progress=False, evaluate=False, profile_model=False))
    assert len(res.steps) == 2 * 4 and [r.epoch for r in res.steps] == [0] * 4 + [1] * 4
    df = res.to_dataframe()
    assert list(df.columns)[:3] == ["step", "epoch", "data_wait_s"] and len(df) == 8


def test_callback_stops_cleanly_and_respects_log_every(data):
    seen = []

    def cb(rec, so_far):
        seen.append(rec.step)
        return rec.step >= 3

    res = train(mlp(), loader(data), TrainConfig(steps=20, progress=False, log_every=2), callback=cb)
    assert seen == [1, 3] and res.stopped_early and len(res.steps) == 4


def test_no_per_step_sync_reports_window_throughput(data):
    res = train(mlp(), loader(data), TrainConfig(steps=6, progress=False, sync_every_step=False, evaluate=False))
    assert all(math.isnan(r.forward_s) for r in res.steps)
    assert all(math.isnan(r.loss) for r in res.steps[:-1]) and math.isfinite(res.steps[-1].loss)
    assert res.samples_per_s_median > 0 and res.samples_per_s_p10 == res.samples_per_s_median


def test_training_reduces_loss_and_lr_warmup(data):
    torch.manual_seed(0)
    x = torch.randn(64, *SHAPE)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()                   # a learnable rule
    ds = torch.utils.data.TensorDataset(x, y)
    cfg = TrainConfig(steps=40, progress=False, lr=0.05, lr_warmup_steps=5, profile_model=False, evaluate=False)
    res = train(mlp(), torch.utils.data.DataLoader(ds, batch_size=16), cfg)
    first, last = statistics.mean(r.loss for r in res.steps[:4]), statistics.mean(r.loss for r in res.steps[-4:])
    assert last < first


def test_evaluate_accuracy_matches_manual(data):
    model = mlp().eval()
    vl = make_loader(data.val, 8)
    with torch.no_grad():
        manual = sum(int((model(x).argmax(1) == y).sum()) for x, y in vl) / len(data.val)
    assert evaluate_accuracy(model, vl) == pytest.approx(manual)


def test_end_of_run_probe_has_no_side_effects_on_batchnorm(data):
    model = SmallCNN(10, width=4)
    cfg = TrainConfig(steps=2, progress=False, evaluate=False, profile_model=False)
    train(model, loader(data), cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    from labkit.stepper import Stepper
    from labkit.loop import make_optimizer
    stepper = Stepper(model, make_optimizer(model, cfg), cfg, torch.device("cpu"))
    stepper.last_inputs = torch.randn(8, *SHAPE)
    flops, mem = stepper.probe()
    assert flops > 0 and mem.batch_size == 8
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_bad_inputs_give_clear_errors(data):
    wrong = MLP(10, in_features=3 * 32 * 32)
    with pytest.raises(ValueError, match="does not accept batches of shape"):
        train(wrong, loader(data), TrainConfig(steps=2, progress=False))
    with pytest.raises(ValueError, match="fp16"):
        train(mlp(), loader(data), TrainConfig(steps=2, progress=False, amp_dtype="fp16"))


def test_bf16_autocast_runs_on_cpu(data):
    res = train(mlp(), loader(data), TrainConfig(steps=3, progress=False, amp_dtype="bf16", evaluate=False))
    assert res.memory.activations_bytes > 0 and len(res.steps) == 3


def test_progress_bar_and_empty_loader(data):
    res = train(mlp(), loader(data), TrainConfig(steps=2, progress=True, evaluate=False, profile_model=False))
    assert len(res.steps) == 2
    small = synthetic_data(n_train=10, n_val=4, image_shape=SHAPE).train
    empty = torch.utils.data.DataLoader(small, batch_size=16, drop_last=True)   # 10 samples -> no batches
    with pytest.raises(ValueError, match="no batches"):
        train(mlp(), empty, TrainConfig(steps=2, progress=False))
