"""The instrumented training loop: timing fields, statistics, stopping, accuracy, bad input."""
import math
import statistics

import pytest
import torch

from labkit.core.data import make_loader, synthetic_data
from labkit.core.device import device_label, get_device
from labkit.core.models import MLP
from labkit.training.config import TrainConfig
from labkit.training.loop import RunResult, StepRecord, evaluate_accuracy, train
from labkit.training.run_spec import RunSpec

SHAPE = (3, 8, 8)
DEVICE = get_device()          # tests run on whatever the machine has (CPU here, CUDA on a GPU box)


@pytest.fixture(scope="module")
def data():
    return synthetic_data(n_train=64, n_val=32, image_shape=SHAPE)


def loader(data, bs=8):
    return make_loader(data.train, bs, shuffle=True)


def mlp():
    torch.manual_seed(0)
    return MLP(10, in_features=3 * 8 * 8, hidden=32)


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
    assert res.stopped_early is False and res.device == device_label(DEVICE)


def test_cpu_memory_flops_and_mfu_note(data):
    res = train(mlp(), loader(data), TrainConfig(steps=3, progress=False, evaluate=False))
    assert res.memory is not None
    if DEVICE.type == "cpu":
        assert res.peak_mem_bytes == res.memory.total_bytes      # on CUDA: max_memory_allocated instead
    assert res.memory.batch_size == 8 and res.memory.optimizer_bytes == res.memory.params_bytes  # SGD momentum
    assert res.flops_per_sample > 0 and res.achieved_flops_per_s == pytest.approx(
        res.flops_per_sample * res.samples_per_s_median)
    if DEVICE.type == "cpu":
        assert res.mfu is None and "unknown" in res.mfu_note and res.peak_flops_per_s is None
        assert res.math_mode == "fp32"
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


def test_default_is_the_cheap_mode_and_both_modes_time_every_phase(data):
    assert TrainConfig(steps=1).sync_every_step is False               # the cheap mode is the default
    for sync in (False, True):
        res = train(mlp(), loader(data), TrainConfig(steps=6, progress=False, sync_every_step=sync, evaluate=False))
        assert all(math.isfinite(r.forward_s) and math.isfinite(r.loss) for r in res.steps)
        assert res.samples_per_s_p10 <= res.samples_per_s_median <= res.samples_per_s_p90
        assert res.final_loss == res.steps[-1].loss
        assert res.extra["timing"] == ("sync" if sync and DEVICE.type == "cuda" else
                                       "events" if DEVICE.type == "cuda" else "host")


def test_marks_and_losses_are_read_once_per_window(data, monkeypatch):
    from labkit.core.timing import PhaseClock

    settles = []
    monkeypatch.setattr(PhaseClock, "settle", lambda self, upto=None: settles.append(1))
    train(mlp(), loader(data), TrainConfig(steps=10, progress=False, read_every=4, evaluate=False,
                                           profile_model=False))
    assert len(settles) == 3                                              # steps 4, 8 and the final 2
    settles.clear()
    train(mlp(), loader(data), TrainConfig(steps=10, progress=False, sync_every_step=True, evaluate=False,
                                           profile_model=False))
    assert len(settles) == 10                                             # the classic loop reads every step


def test_callback_gets_the_public_progress_payload(data):
    from labkit.training.window import TrainProgress

    got = []

    def cb(rec, progress):
        got.append(progress)

    model = mlp()
    run = RunSpec(model="mlp", batch_size=8, lr=0.1, momentum=0.8)
    train(model, loader(data), TrainConfig(steps=4, progress=False, log_every=2, run=run, evaluate=False,
                                           profile_model=False), callback=cb)
    assert len(got) == 2 and all(isinstance(p, TrainProgress) for p in got)
    p = got[-1]
    assert p.steps_done == 4 and p.total_steps == 4 and p.records[-1].step == 3 and len(p.records) == 4
    assert p.model is model and p.last_inputs.shape == (8, *SHAPE) and p.last_inputs.device.type == DEVICE.type
    assert p.run is run and p.lr == 0.1
    assert p.device == str(DEVICE)
    assert not any(type(v).__name__ == "Stepper" for v in vars(p).values())   # no private objects


def test_training_reduces_loss_and_lr_warmup(data):
    torch.manual_seed(0)
    x = torch.randn(64, *SHAPE)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()                   # a learnable rule
    ds = torch.utils.data.TensorDataset(x, y)
    cfg = TrainConfig(steps=40, progress=False, run=RunSpec(batch_size=16, lr=0.05, lr_warmup_steps=5),
                      profile_model=False, evaluate=False)
    res = train(mlp(), torch.utils.data.DataLoader(ds, batch_size=16), cfg)
    first, last = statistics.mean(r.loss for r in res.steps[:4]), statistics.mean(r.loss for r in res.steps[-4:])
    assert last < first


def test_evaluate_accuracy_matches_manual(data):
    model = mlp().eval()
    vl = make_loader(data.val, 8)
    with torch.no_grad():
        manual = sum(int((model(x).argmax(1) == y).sum()) for x, y in vl) / len(data.val)
    assert evaluate_accuracy(model, vl) == pytest.approx(manual)


def test_bad_inputs_give_clear_errors(data):
    wrong = MLP(10, in_features=3 * 32 * 32)
    with pytest.raises(ValueError, match="does not accept batches of shape"):
        train(wrong, loader(data), TrainConfig(steps=2, progress=False))
    if DEVICE.type != "cuda":
        with pytest.raises(ValueError, match="fp16"):
            train(mlp(), loader(data), TrainConfig(steps=2, progress=False, run=RunSpec(batch_size=8, precision="fp16")))
    with pytest.raises(ValueError, match="read_every must be an integer >= 1"):
        TrainConfig(steps=2, read_every=0)


def test_bf16_autocast_runs_on_cpu(data):
    res = train(mlp(), loader(data), TrainConfig(steps=3, progress=False, run=RunSpec(batch_size=8, precision="bf16"),
                                                 evaluate=False))
    assert res.memory.activations_bytes > 0 and len(res.steps) == 3


def test_progress_bar_and_empty_loader(data):
    res = train(mlp(), loader(data), TrainConfig(steps=2, progress=True, evaluate=False, profile_model=False))
    assert len(res.steps) == 2
    small = synthetic_data(n_train=10, n_val=4, image_shape=SHAPE).train
    empty = torch.utils.data.DataLoader(small, batch_size=16, drop_last=True)   # 10 samples -> no batches
    with pytest.raises(ValueError, match="no batches"):
        train(mlp(), empty, TrainConfig(steps=2, progress=False))


class _FakeEvent:
    """A CUDA event stand-in: counts how many were made and the waits on each."""

    made = 0

    def __init__(self, enable_timing=False):
        type(self).made += 1
        self.t_ms, self.waits = None, 0

    def record(self):
        self.t_ms = _FakeEvent.now_ms = getattr(_FakeEvent, "now_ms", 0.0) + 1.0

    def synchronize(self):
        self.waits += 1

    def elapsed_time(self, end):
        return end.t_ms - self.t_ms


def _fake_cuda_run(monkeypatch, steps: int, read_every: int = 25, timing: str = "phases"):
    """The loop's read-back machinery on a mocked CUDA clock: (events made, full-device syncs, records)."""
    from labkit.core import timing as timing_mod
    from labkit.training.loop import _Run

    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(timing_mod, "synchronize", lambda device=None: syncs.append(1))
    _FakeEvent.made = 0
    clock = timing_mod.PhaseClock(torch.device("cuda", 0))
    cfg = TrainConfig(steps=steps, read_every=read_every, timing=timing, progress=False)

    class FakeStepper:
        def step(self, i, batch):
            n = 5 if timing == "phases" else 1
            return tuple(clock.mark() for _ in range(n)), torch.tensor(float(i)), 4

    run = _Run(FakeStepper(), clock, cfg, steps, callback=None)
    run.steps(((0, None) for _ in range(steps)), type("Bar", (), {"update": lambda self, n: None})())
    return _FakeEvent.made, len(syncs), run.records


@pytest.mark.parametrize("timing", ["phases", "step"])
def test_a_gpu_run_makes_its_events_once_and_never_drains_the_queue_between_windows(monkeypatch, timing):
    """Issue 43: on a GPU the loop reuses a fixed pool of events (O(1) allocations per run, not five per step)
    and reads a window only after the next one closed, waiting on that window's own mark, not the device."""
    made_100, syncs_100, records = _fake_cuda_run(monkeypatch, 100, timing=timing)
    made_1000, syncs_1000, records_1000 = _fake_cuda_run(monkeypatch, 1000, timing=timing)
    marks_per_step = 5 if timing == "phases" else 1
    window_events = 25 * marks_per_step + 2                  # the steps' marks, the start mark and the ready mark
    assert made_100 == made_1000 <= 2 * window_events + 1    # two windows in flight at most, whatever the length
    assert syncs_100 == syncs_1000 == 0                      # each window waits on its own ready mark, never the device
    assert [r.step for r in records_1000] == list(range(1000)) and records_1000[-1].loss == 999.0
    assert all(r.step_time_s > 0 for r in records_1000)


def test_the_old_per_step_events_would_have_grown_with_the_run(monkeypatch):
    """The control for the test above: without the pool's reuse, allocations grow with the steps."""
    from labkit.core.timing import PhaseClock

    monkeypatch.setattr(PhaseClock, "release", lambda self, marks: None)      # never give events back
    made_100, _, _ = _fake_cuda_run(monkeypatch, 100)
    made_1000, _, _ = _fake_cuda_run(monkeypatch, 1000)
    assert made_1000 > 9 * made_100 // 2
