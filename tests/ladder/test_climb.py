"""Climbing the ladder: rungs carried forward, left out or not applicable, accuracy judged against rung 0, the
ceiling beside the table. Rung logic is checked exactly with a fake trainer whose throughput is a known function
of the recipe (tests.ladder.fakes); one test runs the real loop end to end.
"""
import math
from types import SimpleNamespace

import pytest
import torch

import labkit.ladder.capabilities as capabilities
from labkit.ladder.capabilities import detect_capabilities
from labkit.ladder.climb import run_ladder, verdict
from labkit.ladder.config import LadderConfig
from labkit.ladder.measure import Measurement
from labkit.ladder.report import LadderResult
from labkit.ladder.rungs import RUNG_KEYS, RUNGS, Recipe
from labkit.training.batch_rules import scaled_lr

from tests.ladder.fakes import MEASURED, fake_trainer, smoke, tiny_mlp


def test_rungs_are_cumulative_and_unhelpful_ones_are_not_carried(fake_result):
    rows = {r.key: r for r in fake_result.rows}
    assert [r.rung for r in fake_result.rows] == list(range(len(RUNGS))) and tuple(rows) == RUNG_KEYS
    assert rows["naive"].status == "baseline" and rows["naive"].batch_size == 1
    assert rows["batch_size"].status == "faster" and rows["batch_size"].batch_size == 8   # fastest probe wins
    assert rows["input_pipeline"].status == "slower" and not rows["input_pipeline"].kept
    assert rows["device_data"].status == "faster" and rows["device_data"].compared_to == 1  # workers left out
    assert rows["no_sync"].compared_to == 3 and rows["no_sync"].kept
    assert rows["mixed_precision"].status == "slower" and not rows["mixed_precision"].kept
    assert rows["channels_last"].status == "faster"
    # channels_last was measured on device data, without bf16 and without workers: 80 * 1.3 * 1.2 * 1.5
    assert rows["channels_last"].samples_per_s == pytest.approx(10 * 8 * 1.3 * 1.2 * 1.5)
    assert rows["compile"].status == "skipped" and rows["ddp"].status == "skipped"
    assert fake_result.best.key == "channels_last"
    assert fake_result.batch_probe == pytest.approx({2: 20.0, 8: 80.0, 16: 80.0})

def test_a_rung_under_half_its_base_speed_stops_early_and_only_it(data):
    """bf16 runs at 0.1x here: after its warm-up and ten steady steps the ladder stops it (it could never be kept)
    and measures no accuracy for it; every rung at least half as fast as its base runs its whole budget."""
    res = run_ladder(smoke(min_optimizer_steps=40, skip=("compile", "ddp")), model_fn=tiny_mlp, data=data,
                     trainer=fake_trainer)
    rows = {r.key: r for r in res.rows}
    bf16 = rows["mixed_precision"]
    full = rows["channels_last"].samples_trained
    assert bf16.status == "slower" and not bf16.kept and bf16.val_accuracy is None
    assert "stopped after 11 steps, under 50% of its base's speed" in bf16.reason
    assert bf16.samples_trained == 11 * bf16.batch_size < full
    assert bf16.speedup_rung == pytest.approx(0.1)
    for key in ("batch_size", "device_data", "no_sync", "channels_last"):
        assert rows[key].samples_trained == full and "stopped" not in rows[key].reason, key


def test_tf32_is_reported_not_dropped(fake_result):
    row = fake_result.rung(5)
    assert row.key == "tf32"
    caps = detect_capabilities(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if caps.tf32_ok:
        assert row.status in MEASURED and row.math_mode == "tf32"
    else:
        assert row.status == "not applicable here" and row.reason == caps.tf32_reason and row.samples_per_s is None
    assert all(r.math_mode == "fp32" for r in fake_result.rows[:5] if r.measured)   # strict fp32 before TF32

def test_speedups_and_ceiling_are_the_measured_ratios(fake_result):
    base = fake_result.rows[0].samples_per_s
    assert base == pytest.approx(10.0)
    for r in fake_result.rows:
        if r.measured:
            assert r.speedup_cumulative == pytest.approx(r.samples_per_s / base)
            ref = fake_result.rung(r.compared_to).samples_per_s if r.compared_to is not None else base
            assert r.speedup_rung == pytest.approx(r.samples_per_s / ref)
            assert r.fraction_of_ceiling == pytest.approx(r.samples_per_s / 200.0)
    assert fake_result.rung(7).speedup_rung == pytest.approx(1.5)
    assert fake_result.rung(6).speedup_rung == pytest.approx(0.1)
    assert fake_result.ceiling_samples_per_s == 200.0 and "rung 7's recipe" in fake_result.ceiling_note

def test_fixed_budget_and_startup_cost(fake_result, data):
    for r in fake_result.rows:
        if r.measured:
            assert r.samples_trained == len(data.train)             # budget: 1 epoch of 64 samples
            assert r.startup_s == pytest.approx(2.0 * r.step_time_s)   # one warm-up step at 3x the steady time
            assert 0.0 <= r.val_accuracy <= 1.0 and r.peak_mem_bytes == 1000
    assert fake_result.rung(1).lr == pytest.approx(scaled_lr(0.05, 8, 32))

def test_a_rungs_run_is_made_once_lr_scaled_and_warmed_up_only_when_scaled_up(data):
    from labkit.ladder.measure import rung_run

    config = LadderConfig.full()
    big, one = rung_run(Recipe(batch_size=512, precision="bfloat16"), config, 30), rung_run(Recipe(batch_size=1), config, 30)
    assert (big.lr_warmup_steps, one.lr_warmup_steps) == (6, 0)
    assert big.lr == pytest.approx(scaled_lr(config.lr, 512, config.lr_ref_batch)) and big.precision == "bf16"
    assert (big.batch_size, big.seed, rung_run(Recipe(), config, 30, seed=4).seed) == (512, config.seed, 4)
    ddp = rung_run(Recipe(batch_size=64, world_size=2), config, 30)      # per-process batch, LR for the global one
    assert ddp.batch_size == 64 and ddp.lr == pytest.approx(scaled_lr(config.lr, 128, config.lr_ref_batch))

def test_not_applicable_and_failing_rungs_are_reported(data, monkeypatch):
    monkeypatch.setattr(capabilities.shutil, "which", lambda name: None)
    monkeypatch.setattr(capabilities, "compiler_status", lambda device_type: (False, "no C++ compiler found"))
    res = run_ladder(smoke(skip=("ddp",), device="cpu"), model_fn=tiny_mlp, data=data, trainer=fake_trainer)
    assert res.rung(8).status == "not applicable here" and "C++ compiler" in res.rung(8).reason
    monkeypatch.undo()

    def broken_compile(model, loader, cfg, val_loader=None):
        if cfg.spec.compile:
            raise RuntimeError("inductor exploded\nlong traceback")
        return fake_trainer(model, loader, cfg)

    monkeypatch.setattr(capabilities, "compiler_status", lambda device_type: (True, "mocked"))
    res = run_ladder(smoke(skip=("ddp",)), model_fn=tiny_mlp, data=data, trainer=broken_compile)
    row = res.rung(8)
    assert row.status == "unsupported here" and row.reason == "RuntimeError: inductor exploded"
    assert row.samples_per_s is None and not row.kept

def test_verdict_judges_accuracy_against_rung_0():
    job = SimpleNamespace(config=LadderConfig.smoke())
    m = lambda sps, acc=0.9: Measurement(sps, 1.0, 0.0, None, None, acc, 0.0, 10, 100)  # noqa: E731
    assert verdict(job, m(110.0), 100.0, 1, 0.9)[::2] == ("faster", True)
    assert verdict(job, m(102.0), 100.0, 1, 0.9)[::2] == ("no clear gain", False)
    assert verdict(job, m(90.0), 100.0, 1, 0.9)[::2] == ("slower", False)
    status, reason, kept = verdict(job, m(150.0, acc=0.084), 100.0, 0, 0.972)     # the H100's rung 1
    assert status == "faster" and not kept and "below rung 0's 97.2%" in reason
    assert verdict(job, m(150.0, acc=0.885), 100.0, 1, 0.9)[2] is True          # within 2 points

def test_a_rung_that_loses_accuracy_is_not_carried(data):
    """Rung 1 learns nothing (chance) -> not carried; later rungs build on rung 0's batch 1."""
    def chance_at_large_batch(model, loader, cfg, val_loader=None):
        result = fake_trainer(model, loader, cfg)
        if int(next(iter(loader))[0].shape[0]) > 1:
            torch.nn.init.zeros_(model.net[-1].weight)
            torch.nn.init.zeros_(model.net[-1].bias)
        return result

    res = run_ladder(smoke(device="cpu"), model_fn=tiny_mlp, data=data, trainer=chance_at_large_batch)
    r0, r1 = res.rung(0), res.rung(1)
    if r1.val_accuracy < r0.val_accuracy - 0.02:
        assert not r1.kept and r1.accuracy_ok is False and res.rung(3).compared_to == 0
        assert res.best.rung != 1

def test_bad_candidates_give_one_clear_error(data):
    with pytest.raises(ValueError, match="no batch in batch_candidates"):
        run_ladder(smoke(batch_candidates=(1000,)), model_fn=tiny_mlp, data=data, trainer=fake_trainer)

def test_real_loop_end_to_end(data):
    """The real instrumented loop (and the real device-resident loader) on a tiny MLP."""
    res = run_ladder(smoke(skip=("compile", "ddp", "input_pipeline"), measure_ceiling=True), model_fn=tiny_mlp,
                     data=data)
    for r in res.rows:
        if r.measured:
            assert r.samples_per_s > 0 and math.isfinite(r.step_time_s) and 0 <= r.val_accuracy <= 1
            assert r.speedup_cumulative == pytest.approx(r.samples_per_s / res.rung(0).samples_per_s)
    assert res.rung(1).batch_size in (2, 8, 16) and res.rung(3).status in MEASURED
    assert res.ceiling_samples_per_s > 0

def test_best_ignores_rungs_that_lost_accuracy(fake_result):
    from dataclasses import replace

    rows = list(fake_result.rows)
    rows[9] = replace(rows[7], rung=9, key="ddp", samples_per_s=1e6, accuracy_ok=False)
    assert LadderResult(rows, "cpu", "fast", "mlp", "synthetic", 64).best.key == "channels_last"
    rows[9] = replace(rows[9], accuracy_ok=True)
    assert LadderResult(rows, "cpu", "fast", "mlp", "synthetic", 64).best.rung == 9


def test_the_climb_runs_with_threads_matched_to_the_free_cpus(data, monkeypatch):
    """A busy core: the ladder climbs with the free CPUs' threads, says so, and gives the pool back."""
    from labkit.core import threads
    before, seen = torch.get_num_threads(), []
    monkeypatch.setattr(threads, "idle_cpus", lambda window_s: 0.0)

    def counting_trainer(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return fake_trainer(*args, **kwargs)
    res = run_ladder(smoke(skip=("ddp",), device="cpu"), model_fn=tiny_mlp, data=data, trainer=counting_trainer)
    assert seen and set(seen) == {1} and torch.get_num_threads() == before
    assert any(n.startswith("intra-op threads: 1 of the") for n in res.notes)


def test_a_dropped_rung_is_left_out_later_and_nothing_kept_lost_accuracy(fake_result):
    """Notebook 10 once asserted these live; they are the ladder's own bookkeeping, so they live here (issue 51):
    a rung not carried forward is absent from every later rung's recipe, and a kept rung is within the tolerance."""
    toggles = {"input_pipeline": "num_workers", "device_data": "device_data", "no_sync": "sync_every_step",
               "tf32": "tf32", "mixed_precision": "precision", "channels_last": "channels_last", "compile": "compile"}
    naive = fake_result.rung(0).recipe
    dropped = [r for r in fake_result.rows if r.key in toggles and r.measured and not r.kept]
    assert {r.key for r in dropped} >= {"input_pipeline", "mixed_precision"}
    for r in dropped:
        later = [x for x in fake_result.rows if x.rung > r.rung and x.measured]
        assert later and all(x.recipe[toggles[r.key]] == naive[toggles[r.key]] for x in later), r.title
    acc0, tol = fake_result.rung(0).val_accuracy, LadderConfig.smoke().accuracy_tolerance
    for r in fake_result.rows[1:]:
        if r.val_accuracy is not None:
            assert r.kept <= (r.val_accuracy >= acc0 - tol), r.title
