"""The batch-size sweep: rows, memory budget, LR scaling, time budget, the knee."""
import math

import pytest

from labkit.core.data import synthetic_data
from labkit.core.models import MLP
from labkit.memory.model import build_memory_model
from labkit.training.batch_size import batch_size_sweep, knee_batch

SHAPE = (3, 8, 8)


def test_knee():
    assert knee_batch([1, 2, 4, 8, 16], [10, 50, 92, 100, 99]) == 4
    assert knee_batch([], []) is None


@pytest.fixture(scope="module")
def data():
    return synthetic_data(n_train=96, n_val=32, image_shape=SHAPE)


def test_sweep_rows_budget_and_lr_scaling(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    budget = build_memory_model(make(), SHAPE).predict(16).total_bytes
    res = batch_size_sweep(make, data, [2, 8, 32], steps=3, lr_scaling=True, base_lr=0.04, base_batch=8,
                           memory_budget_bytes=budget, progress=False)
    df = res.to_dataframe()
    assert list(df.batch_size) == [2, 8, 32] and list(df.fits) == [True, True, False]
    assert list(df.lr) == pytest.approx([0.01, 0.04, 0.16])
    assert "does not fit" in res.rows[2].note and math.isnan(res.rows[2].samples_per_s)
    assert all(r.samples_per_s > 0 and 0 <= r.val_accuracy <= 1 and r.steps == 3 for r in res.rows[:2])
    assert res.knee() in (2, 8)
    import matplotlib
    matplotlib.use("Agg")
    axes = res.plot()
    assert axes[0].get_xscale() == "log"


def test_sweep_time_budget_and_bad_sizes(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    res = batch_size_sweep(make, data, [4], steps=500, time_budget_s=1e-9, progress=False)
    assert res.rows[0].steps == 1                                 # stopped by the time budget after one step
    with pytest.raises(ValueError, match="larger than the dataset"):
        batch_size_sweep(make, data, [1000], steps=1, progress=False)
    with pytest.raises(ValueError, match=r"batch size in batch_sizes must be an integer between 1 and \d+, got 0"):
        batch_size_sweep(make, data, [0], steps=1, progress=False)


def test_sweep_ceiling_beside_every_row_that_ran(data):
    """ceiling=True: each row that ran gets its ceiling, measured with the row's recipe, steps and real samples."""
    from types import SimpleNamespace

    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    budget = build_memory_model(make(), SHAPE).predict(16).total_bytes
    calls = []

    def fake_ceiling(model, batch_size, config, **kwargs):
        calls.append((batch_size, config, kwargs))
        return SimpleNamespace(samples_per_s_median=1000.0 * batch_size)

    res = batch_size_sweep(make, data, [2, 8, 32], steps=3, lr_scaling=True, base_batch=8, memory_budget_bytes=budget,
                           progress=False, ceiling=True, ceiling_repeats=2, ceiling_fn=fake_ceiling)
    assert [c[0] for c in calls] == [2, 8]                         # batch 32 does not fit: nothing to bound
    for (bs, cfg, kwargs), row in zip(calls, res.rows):
        assert cfg.steps == row.steps == 3 and cfg.epochs is None and not cfg.evaluate and cfg.spec.lr == row.lr
        assert kwargs["repeats"] == 2 and kwargs["sample_from"] is data.train
        assert kwargs["image_shape"] == SHAPE and kwargs["num_classes"] == data.num_classes
        assert row.ceiling_samples_per_s == 1000.0 * bs
        assert row.fraction_of_ceiling == pytest.approx(row.samples_per_s / row.ceiling_samples_per_s)
    assert res.rows[2].ceiling_samples_per_s is None and res.rows[2].fraction_of_ceiling is None
    assert {"ceiling_samples_per_s", "fraction_of_ceiling"} <= set(res.to_dataframe().columns)


def test_sweep_ceiling_measured_for_real(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    res = batch_size_sweep(make, data, [4, 16], steps=4, progress=False, ceiling=True, ceiling_repeats=1)
    for row in res.rows:
        assert row.ceiling_samples_per_s > 0 and row.fraction_of_ceiling > 0
        assert row.fraction_of_ceiling == pytest.approx(row.samples_per_s / row.ceiling_samples_per_s)
    import matplotlib
    matplotlib.use("Agg")
    axes = res.plot()
    assert "ceiling (batches on the device)" in [t.get_text() for t in axes[0].get_legend().get_texts()]
    plain = batch_size_sweep(make, data, [4], steps=2, progress=False)
    assert plain.rows[0].ceiling_samples_per_s is None and plain.rows[0].fraction_of_ceiling is None


def test_sweep_bad_ceiling_repeats(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="ceiling_repeats must be an integer >= 1"):
            batch_size_sweep(make, data, [4], steps=1, progress=False, ceiling=True, ceiling_repeats=bad)


class SpellMachine:
    """Fake train() and ceiling: each size has a true speed; runs during a slow spell (by call number) go 10x slower."""

    def __init__(self, speeds: dict[int, float], spell: range = range(0)):
        self.speeds, self.spell, self.calls = speeds, spell, []

    def _result(self, kind: str, batch_size: int, steps: int):
        from types import SimpleNamespace

        slow = 10.0 if len(self.calls) in self.spell else 1.0
        self.calls.append((kind, batch_size))
        rate = self.speeds[batch_size] / slow * (1.1 if kind == "ceiling" else 1.0)
        return SimpleNamespace(samples_per_s_median=rate, step_time_median_s=batch_size / rate, peak_mem_bytes=None,
                               val_accuracy=0.5, steps=[None] * steps)

    def train(self, model, loader, config, val_loader=None, callback=None):
        return self._result("train" if config.evaluate and val_loader is not None else "again", loader.batch_size,
                            config.steps)

    def ceiling(self, model, batch_size, config, **kwargs):
        return self._result("ceiling", batch_size, config.steps)


def spell_sweep(monkeypatch, data, machine, rounds):
    import labkit.training.batch_size as sweep_module

    monkeypatch.setattr(sweep_module, "train", machine.train)
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    return batch_size_sweep(make, data, [2, 8], steps=3, progress=False, rounds=rounds, ceiling=True,
                            ceiling_fn=machine.ceiling)


def test_rounds_take_turns_and_keep_the_fastest_so_a_slow_spell_does_not_decide(monkeypatch, data):
    """Batch 8 is 2x faster; a spell slows batch 8's first round and batch 2's second. Once, the spell decides."""
    speeds, spell = {2: 100.0, 8: 200.0}, range(2, 6)       # calls 2-5: batch 8 in round 1, batch 2 in round 2
    once = spell_sweep(monkeypatch, data, SpellMachine(speeds, spell), rounds=1)
    assert once.rows[1].samples_per_s < once.rows[0].samples_per_s          # the flaky comparison, reproduced
    machine = SpellMachine(speeds, spell)
    res = spell_sweep(monkeypatch, data, machine, rounds=3)
    assert machine.calls == [("train", 2), ("ceiling", 2), ("train", 8), ("ceiling", 8)] + [
        ("again", 2), ("ceiling", 2), ("again", 8), ("ceiling", 8)] * 2              # round by round, in turn
    small, big = res.rows
    assert small.round_samples_per_s == pytest.approx((100.0, 10.0, 100.0))
    assert big.round_samples_per_s == pytest.approx((20.0, 200.0, 200.0))
    assert (small.samples_per_s, big.samples_per_s) == pytest.approx((100.0, 200.0))     # the fastest round
    assert big.step_time_s == pytest.approx(8 / 200.0) and small.step_time_s == pytest.approx(2 / 100.0)
    assert big.ceiling_samples_per_s == pytest.approx(220.0) and big.fraction_of_ceiling == pytest.approx(1 / 1.1)
    assert big.val_accuracy == 0.5 and big.steps == 3


def test_rounds_still_show_a_batch_that_is_really_slower(monkeypatch, data):
    """Keeping the fastest round is no tolerance: a larger batch that is slower in truth stays slower."""
    res = spell_sweep(monkeypatch, data, SpellMachine({2: 100.0, 8: 90.0}, range(0, 2)), rounds=3)
    assert res.rows[1].samples_per_s < res.rows[0].samples_per_s


def test_ceiling_repeats_per_round(data):
    from types import SimpleNamespace

    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    for rounds, expected in ((1, 3), (2, 1)):
        repeats = []

        def fake(model, batch_size, config, **kwargs):
            repeats.append(kwargs["repeats"])
            return SimpleNamespace(samples_per_s_median=1e3)

        batch_size_sweep(make, data, [4], steps=2, progress=False, rounds=rounds, ceiling=True, ceiling_fn=fake)
        assert repeats == [expected] * rounds
    with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
        batch_size_sweep(make, data, [4], steps=1, progress=False, rounds=0)


def test_one_memory_model_per_sweep_gives_the_cpu_peaks(monkeypatch, data):
    import labkit.training.run_spec as run_spec_module     # the one place a run's memory model is built

    built = []
    real = run_spec_module.build_memory_model
    monkeypatch.setattr(run_spec_module, "build_memory_model", lambda *a, **k: built.append(a) or real(*a, **k))
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    res = batch_size_sweep(make, data, [2, 4, 8], steps=2, progress=False, rounds=2)
    assert len(built) == 1
    mm = real(make(), SHAPE, "sgd", 0.9)
    assert [r.peak_mem_bytes for r in res.rows] == [mm.predict(b).total_bytes for b in (2, 4, 8)]
    assert all(len(r.round_samples_per_s) == 2 and r.samples_per_s == max(r.round_samples_per_s) for r in res.rows)


def test_ratio_compares_round_by_round_when_load_starts_or_stops(monkeypatch, data):
    """Batch 8 really is 2x faster. Each side's fastest round would compare a quiet run with busy ones; round by
    round (each pair seconds apart) the comparison holds whether the load starts or stops mid-sweep."""
    starts = spell_sweep(monkeypatch, data, SpellMachine({2: 100.0, 8: 200.0}, range(1, 10**6)), rounds=3)
    small, big = starts.rows                                    # load from batch 2's first ceiling on
    assert small.round_samples_per_s == pytest.approx((100.0, 10.0, 10.0))
    assert big.samples_per_s < small.samples_per_s and starts.ratio(8, 2) == pytest.approx(2.0)
    assert small.samples_per_s / small.ceiling_samples_per_s > 9                 # a quiet run over a busy ceiling
    assert small.fraction_of_ceiling == pytest.approx(10.0 / 11.0)               # the median round over it
    stops = spell_sweep(monkeypatch, data, SpellMachine({2: 100.0, 8: 200.0}, range(0, 10)), rounds=3)
    small, big = stops.rows                                     # load until batch 8's last round
    assert big.step_time_s < small.step_time_s                  # fastest rounds: a quiet big step, busy small ones
    assert stops.ratio(8, 2, of="step_time_s") == pytest.approx(2.0) and stops.ratio(8, 2) == pytest.approx(2.0)
    assert big.round_step_time_s == pytest.approx((0.4, 0.4, 0.04))
    assert stops.ratio(8, 99) is None
    with pytest.raises(ValueError, match="of must be one of"):
        stops.ratio(8, 2, of="val_accuracy")
