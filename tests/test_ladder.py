"""The tuning ladder: rung logic (carry forward / leave out), speedup arithmetic, reports, config checks.

Rung logic is checked exactly with a fake trainer whose throughput is a known function of the recipe;
one test runs the real instrumented loop end to end on a tiny model, one the real DDP rung.
"""
import functools
import json
import math
from types import SimpleNamespace

import pytest
import torch

from labkit.data import synthetic_data
from labkit.ladder import LadderConfig, add_ladder_arguments, ladder_main, run_ladder
from labkit.ladder_climb import LadderJob, _verdict
from labkit.batch_size import scaled_lr
from labkit.ladder_rungs import (RUNG_KEYS, RUNGS, Capabilities, Measurement, Recipe, detect_capabilities, propose,
                                 steps_for_budget, summarise_run)
from labkit.models import MLP

SHAPE = (3, 8, 8)


@pytest.fixture(scope="module")
def data():
    return synthetic_data(n_train=64, n_val=16, image_shape=SHAPE)


tiny_mlp = functools.partial(MLP, 10, 3 * 8 * 8, 16)   # picklable, so the DDP rung can send it to its ranks


def fake_rate(batch: int, cfg, workers: int) -> float:
    """Known samples/s per recipe: batch helps up to 8, workers and bf16 hurt, channels_last +50%,
    no-sync +20%, compile +1% (under the 3% bar)."""
    rate = 10.0 * min(batch, 8)
    rate *= 0.5 if workers else 1.0
    rate *= 1.2 if not cfg.sync_every_step else 1.0
    rate *= 0.1 if cfg.amp_dtype else 1.0
    rate *= 1.5 if cfg.channels_last else 1.0
    rate *= 1.01 if cfg.compile else 1.0
    return rate


def fake_trainer(model, loader, cfg, val_loader=None):
    """Stands in for labkit.loop.train: step records whose times give exactly fake_rate()."""
    rate = fake_rate(loader.batch_size, cfg, loader.num_workers)
    step_s = loader.batch_size / rate
    steps = [SimpleNamespace(samples=loader.batch_size, step_time_s=step_s * (3.0 if i < cfg.warmup_steps else 1.0))
             for i in range(cfg.steps)]
    return SimpleNamespace(steps=steps, samples_per_s_median=rate, data_wait_fraction=0.25, peak_mem_bytes=1000,
                           flops_per_sample=None)


def smoke(**overrides):
    return LadderConfig.smoke(**{"batch_candidates": (2, 8, 16), **overrides})


@pytest.fixture(scope="module")
def fake_result(data):
    return run_ladder(smoke(), model_fn=tiny_mlp, data=data, trainer=fake_trainer)


def test_rungs_are_cumulative_and_unhelpful_ones_are_not_carried(fake_result):
    rows = {r.key: r for r in fake_result.rows}
    assert [r.rung for r in fake_result.rows] == list(range(8)) and tuple(rows) == RUNG_KEYS
    assert rows["naive"].status == "baseline" and rows["naive"].batch_size == 1
    assert rows["batch_size"].status == "faster" and rows["batch_size"].batch_size == 8   # fastest probe wins
    assert rows["input_pipeline"].status == "slower" and not rows["input_pipeline"].kept
    assert rows["no_sync"].status == "faster" and rows["no_sync"].compared_to == 1      # workers were left out
    assert rows["mixed_precision"].status == "slower" and not rows["mixed_precision"].kept
    assert rows["channels_last"].compared_to == 3 and rows["channels_last"].status == "faster"
    # channels_last was measured without bf16 and without workers: 80 * 1.2 * 1.5
    assert rows["channels_last"].samples_per_s == pytest.approx(10 * 8 * 1.2 * 1.5)
    assert rows["compile"].status == "skipped" and rows["ddp"].status == "skipped"
    assert fake_result.best.key == "channels_last"
    assert fake_result.batch_probe == pytest.approx({2: 20.0, 8: 80.0, 16: 80.0})


def test_speedups_are_the_measured_ratios(fake_result):
    rows = fake_result.rows
    base = rows[0].samples_per_s
    assert base == pytest.approx(10.0)
    for r in rows:
        if r.measured:
            assert r.speedup_cumulative == pytest.approx(r.samples_per_s / base)
            ref = fake_result.rung(r.compared_to).samples_per_s if r.compared_to is not None else base
            assert r.speedup_rung == pytest.approx(r.samples_per_s / ref)
    assert fake_result.rung(5).speedup_rung == pytest.approx(1.5)
    assert fake_result.rung(4).speedup_rung == pytest.approx(0.1)


def test_fixed_budget_and_startup_cost(fake_result, data):
    for r in fake_result.rows:
        if r.measured:
            assert r.samples_trained == len(data.train)             # budget: 1 epoch of 64 samples
            assert r.startup_s == pytest.approx(2.0 * r.step_time_s)   # one warm-up step at 3x the steady time
            assert 0.0 <= r.val_accuracy <= 1.0 and r.peak_mem_bytes == 1000
    assert fake_result.rung(1).lr == pytest.approx(scaled_lr(0.05, 8, 32))


def test_compile_unsupported_and_failing_rungs_are_reported(data, monkeypatch):
    import labkit.ladder_rungs as rungs

    monkeypatch.setattr(rungs.shutil, "which", lambda name: None)
    res = run_ladder(smoke(skip=("ddp",)), model_fn=tiny_mlp, data=data, trainer=fake_trainer)
    assert res.rung(6).status == "unsupported here" and "C++ compiler" in res.rung(6).reason
    monkeypatch.undo()

    def broken_compile(model, loader, cfg, val_loader=None):
        if cfg.compile:
            raise RuntimeError("inductor exploded\nlong traceback")
        return fake_trainer(model, loader, cfg)

    res = run_ladder(smoke(skip=("ddp",)), model_fn=tiny_mlp, data=data, trainer=broken_compile)
    row = res.rung(6)
    assert row.status == "unsupported here" and row.reason == "RuntimeError: inductor exploded"
    assert row.samples_per_s is None and not row.kept


def test_ddp_unsupported_with_one_device():
    caps = detect_capabilities(torch.device("cpu"), ddp_world_size=1)
    recipe, why = propose("ddp", Recipe(batch_size=8), caps, 8)
    assert recipe is None and "at least 2 processes" in why
    caps = detect_capabilities(torch.device("cpu"), ddp_world_size=2)
    recipe, why = propose("ddp", Recipe(batch_size=8), caps, 8)
    assert recipe.world_size == 2 and recipe.global_batch == 16 and "global batch 16" in why


def test_verdict_statuses_and_accuracy_guard():
    job = SimpleNamespace(config=LadderConfig.smoke())
    m = lambda sps, acc=0.9: Measurement(sps, 1.0, 0.0, None, None, acc, 0.0, 10, 100)  # noqa: E731
    assert _verdict(job, m(110.0), 100.0, 1, 0.9)[::2] == ("faster", True)
    assert _verdict(job, m(102.0), 100.0, 1, 0.9)[::2] == ("no clear gain", False)
    assert _verdict(job, m(90.0), 100.0, 1, 0.9)[::2] == ("slower", False)
    status, reason, kept = _verdict(job, m(150.0, acc=0.85), 100.0, 1, 0.9)
    assert status == "faster" and not kept and "below rung 1's 90.0%" in reason
    assert _verdict(job, m(150.0, acc=0.895), 100.0, 1, 0.9)[2] is True          # within 1 point


def test_budget_arithmetic_and_summary():
    assert steps_for_budget(1000, 32, 4) == 31 and steps_for_budget(10, 32, 4) == 4
    assert scaled_lr(0.1, 256, 32) == pytest.approx(0.8)
    recs = [SimpleNamespace(samples=4, step_time_s=t) for t in (1.0, 0.1, 0.2, 0.1)]
    res = SimpleNamespace(steps=recs, samples_per_s_median=99.0)
    sps, step_s, startup_s = summarise_run(res, warmup_steps=1, sync_every_step=True)
    assert sps == pytest.approx(12 / 0.4) and step_s == pytest.approx(0.4 / 3)
    assert startup_s == pytest.approx(1.0 - 0.4 / 3)
    assert summarise_run(res, 1, sync_every_step=False)[0] == 99.0                 # the loop's window rate


def test_reports(fake_result, tmp_path):
    md = fake_result.to_markdown()
    assert md.startswith("Device: CPU") and "Mode:" in md and "(02_batch_size.ipynb)" in md
    assert md.count("\n| ") == 1 + len(RUNGS)                                      # header + one line per rung
    assert "not carried forward" in md and "skipped" in md
    doc = json.loads(fake_result.to_json())
    assert [r["rung"] for r in doc["rows"]] == list(range(8))
    assert doc["rows"][6]["samples_per_s"] is None
    assert doc["rows"][5]["speedup_cumulative"] == pytest.approx(fake_result.rung(5).speedup_cumulative)
    json_path, md_path = fake_result.save(tmp_path / "out")
    assert json.loads(json_path.read_text())["budget_samples"] == 64 and "notebooks/" in md_path.read_text()
    fig = fake_result.plot()
    assert len(fig.axes) == 2
    import matplotlib.pyplot as plt

    plt.close(fig)
    assert list(fake_result.to_dataframe().index) == list(range(8))


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "vgg"}, "model must be one of"),
    ({"budget_epochs": 0}, "budget_epochs must be a positive integer"),
    ({"batch_candidates": ()}, "batch_candidates"),
    ({"batch_candidates": (8, 0)}, "batch_candidates"),
    ({"skip": ("naive",)}, "rung 0 is the baseline"),
    ({"skip": ("warp_drive",)}, "skip may name"),
    ({"lr": -1.0}, "lr must be > 0"),
    ({"min_gain": 1.5}, "min_gain"),
    ({"num_workers": -1}, "num_workers must be an integer >= 0"),
    ({"ddp_world_size": 0}, "ddp_world_size must be a positive integer"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LadderConfig(**kwargs)


def test_presets_and_args():
    assert LadderConfig.fast().model == "small_cnn" and LadderConfig.full().model == "resnet18"
    assert LadderConfig().model == "resnet18"
    import argparse

    args = add_ladder_arguments(argparse.ArgumentParser()).parse_args(
        ["--model", "mlp", "--batch-sizes", "4", "8", "--skip", "compile", "ddp", "--budget-epochs", "2"])
    cfg = LadderConfig.from_args(args)
    assert (cfg.model, cfg.batch_candidates, cfg.skip, cfg.budget_epochs) == ("mlp", (4, 8), ("compile", "ddp"), 2)


def test_bad_candidates_give_one_clear_error(data):
    with pytest.raises(ValueError, match="no batch in batch_candidates"):
        run_ladder(smoke(batch_candidates=(1000,)), model_fn=tiny_mlp, data=data, trainer=fake_trainer)


def test_real_loop_end_to_end(data):
    """The real instrumented loop on a tiny MLP: every measured rung has finite numbers."""
    res = run_ladder(smoke(skip=("compile", "ddp", "input_pipeline")), model_fn=tiny_mlp, data=data)
    for r in res.rows:
        if r.measured:
            assert r.samples_per_s > 0 and math.isfinite(r.step_time_s) and 0 <= r.val_accuracy <= 1
            assert r.speedup_cumulative == pytest.approx(r.samples_per_s / res.rung(0).samples_per_s)
    assert res.rung(1).batch_size in (2, 8, 16)


def test_ladder_main_writes_json_and_markdown(tmp_path, capsys):
    code = ladder_main(["--out", str(tmp_path), "--model", "mlp", "--dataset", "digits", "--train-limit", "32",
                        "--budget-epochs", "1", "--batch-sizes", "4", "8", "--skip", "input_pipeline", "no_sync",
                        "mixed_precision", "channels_last", "compile", "ddp"])
    assert code == 0
    doc = json.loads((tmp_path / "ladder.json").read_text())
    assert doc["rows"][1]["status"] in ("faster", "slower", "no clear gain") and doc["dataset"] == "digits"
    assert (tmp_path / "ladder.md").read_text().startswith("Device:")
    assert "wrote" in capsys.readouterr().out
    assert ladder_main(["--out", str(tmp_path), "--batch-sizes", "0"]) == 2


def test_ddp_rung_on_two_gloo_processes(data):
    """Rung 7 for real: two gloo processes, global batch and LR scaled, accuracy read on rank 0."""
    from labkit.ladder_climb import measure_recipe

    caps = Capabilities("cpu", 2, "bf16", False, "", 2, "", 1)
    from labkit.data import make_loader

    job = LadderJob(smoke(), tiny_mlp, data, "cpu", caps, make_loader(data.val, 16), 64)
    m = measure_recipe(job, Recipe(batch_size=8, world_size=2))
    assert m.samples_trained == 64 and m.steps == 4 and m.samples_per_s > 0 and 0 <= m.val_accuracy <= 1


def test_best_ignores_rungs_that_lost_accuracy(fake_result):
    from dataclasses import replace

    from labkit.ladder_report import LadderResult

    rows = list(fake_result.rows)
    rows[7] = replace(rows[5], rung=7, key="ddp", samples_per_s=1e6, accuracy_ok=False)
    res = LadderResult(rows, "cpu", "fast", "mlp", "synthetic", 64)
    assert res.best.key == "channels_last"
    rows[7] = replace(rows[7], accuracy_ok=True)
    assert LadderResult(rows, "cpu", "fast", "mlp", "synthetic", 64).best.rung == 7
