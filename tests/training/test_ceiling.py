"""The hardware ceiling: device-resident synthetic batches through the real loop."""
import pytest

from labkit.core.device import get_device
from labkit.core.models import MLP
from labkit.training.ceiling import ResidentBatches, measure_ceiling
from labkit.training.config import TrainConfig
from labkit.training.loop import RunResult

DEVICE = get_device()
SHAPE = (3, 8, 8)


def model():
    return MLP(10, in_features=3 * 8 * 8, hidden=16)


def test_resident_batches_live_on_the_device_and_cycle():
    batches = ResidentBatches(8, SHAPE, 10, length=6, device=DEVICE)
    got = list(batches)
    assert len(batches) == 6 and len(got) == 6 and len(batches.pool) == 4
    assert got[4][0] is got[0][0]                                  # cycled, never re-made
    x, y = got[0]
    assert x.shape == (8, *SHAPE) and x.device.type == DEVICE.type and y.device.type == DEVICE.type
    assert int(y.min()) >= 0 and int(y.max()) < 10


def test_ceiling_is_a_run_result_with_no_data_wait():
    cfg = TrainConfig(steps=6, progress=False, profile_model=False, evaluate=True, warmup_steps=1)
    res = measure_ceiling(model(), 8, cfg, image_shape=SHAPE, num_classes=10)
    assert isinstance(res, RunResult) and len(res.steps) == 6 and res.val_accuracy is None
    assert res.samples_per_s_median > 0 and "resident" in res.extra["ceiling"]
    # nothing to wait for: the batches are already there (a loose bound: scheduler noise only)
    assert res.data_wait_fraction < 0.2


def test_ceiling_bounds_a_starved_loader():
    """The same model fed through a deliberately slow loader is below the ceiling (work >> noise)."""
    import time

    import torch

    class Slow:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __iter__(self):
            for _ in range(self.n):
                time.sleep(0.02)                                   # 20 ms per batch: >> an MLP step
                yield torch.randn(8, *SHAPE), torch.randint(0, 10, (8,))

    from labkit.training.loop import train

    cfg = TrainConfig(steps=6, progress=False, profile_model=False, evaluate=False, warmup_steps=1)
    fed = measure_ceiling(model(), 8, cfg, image_shape=SHAPE, num_classes=10)
    starved = train(model(), Slow(6), cfg)
    assert starved.samples_per_s_median < fed.samples_per_s_median
    import statistics

    assert statistics.median(r.data_wait_s for r in starved.steps) >= 0.019   # every sleep is counted as wait
    assert starved.data_wait_fraction > fed.data_wait_fraction


def test_ceiling_epochs_config_and_bad_input():
    res = measure_ceiling(model(), 4, TrainConfig(epochs=3, progress=False, profile_model=False),
                          image_shape=SHAPE, num_classes=10)
    assert len(res.steps) == 3
    cfg = TrainConfig(steps=2, progress=False)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        measure_ceiling(model(), 0, cfg, image_shape=SHAPE, num_classes=10)
    with pytest.raises(ValueError, match="image_shape must be a tuple such as"):
        measure_ceiling(model(), 4, cfg, image_shape=32, num_classes=10)
    with pytest.raises(ValueError, match="each image_shape size must be an integer >= 1, got 0"):
        measure_ceiling(model(), 4, cfg, image_shape=(3, 0, 8), num_classes=10)


def test_ceiling_is_the_fastest_of_its_repeats():
    """An upper bound is estimated by the best repeat, so one slow run on a busy machine cannot pull it down."""
    cfg = TrainConfig(steps=4, progress=False, profile_model=False, evaluate=False, warmup_steps=1)
    res = measure_ceiling(model(), 8, cfg, image_shape=SHAPE, num_classes=10, repeats=3)
    rates = res.extra["repeat_samples_per_s"]
    assert len(rates) == 3 and res.samples_per_s_median == max(rates)
    assert "fastest of 3" in res.extra["ceiling"]
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        measure_ceiling(model(), 4, cfg, image_shape=SHAPE, num_classes=10, repeats=0)


def test_ceiling_cycles_real_samples_when_given():
    """With sample_from the pool is the dataset's own first batches, prepared on the device (not noise)."""
    import torch
    from torch.utils.data import TensorDataset

    xs, ys = torch.arange(24 * 192, dtype=torch.float32).view(24, *SHAPE), torch.arange(24) % 10
    batches = ResidentBatches(8, SHAPE, 10, length=5, device=DEVICE, sample_from=TensorDataset(xs, ys))
    assert len(batches.pool) == 3                                  # 24 samples: three full batches of 8
    x, y = batches.pool[1]
    assert torch.equal(x.cpu(), xs[8:16]) and torch.equal(y.cpu(), ys[8:16]) and x.device.type == DEVICE.type
    cfg = TrainConfig(steps=3, progress=False, profile_model=False, evaluate=False, warmup_steps=1)
    res = measure_ceiling(model(), 8, cfg, image_shape=SHAPE, num_classes=10, repeats=1,
                          sample_from=TensorDataset(xs, ys))
    assert "real batches" in res.extra["ceiling"]
    with pytest.raises(ValueError, match="sample_from has 4 samples, fewer than batch_size=8"):
        measure_ceiling(model(), 8, cfg, image_shape=SHAPE, num_classes=10, sample_from=TensorDataset(xs[:4], ys[:4]))
