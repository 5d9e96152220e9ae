"""Dashboard runs as data: samples and seconds accumulate, time to a target, spreads between repeats, the knee."""
from types import SimpleNamespace

import pandas as pd
import pytest

from labkit.training.run_spec import RunSpec
from labkit.ui.batch_runs import (DashboardRun, knee_of_runs, repeat_spreads, results_table, spread_warnings,
                                  throughput_spread, time_to_target, update_latency)


def finished(batch=32, accs=(0.5, 0.9), model="mlp", sps=100.0, seed=0, steps=4):
    run = DashboardRun(RunSpec(model=model, batch_size=batch, lr=0.05, seed=seed), steps, "same lr")
    for i, acc in enumerate(accs):
        run.add_step(i + 1, batch, 0.5, batch / 0.5, 1.0 / (i + 1))
        run.add_accuracy(acc)
    run.result = SimpleNamespace(samples_per_s_median=sps, samples_per_s_p10=0.9 * sps, samples_per_s_p90=1.1 * sps)
    return run


def test_steps_accumulate_samples_and_training_seconds():
    run = DashboardRun(RunSpec(model="mlp", batch_size=8, lr=0.05), 10)
    run.add_step(1, 8, 0.25, 32.0, 2.0)
    run.add_step(2, 8, 0.5, 16.0, 1.5)
    assert [p["samples_seen"] for p in run.points] == [8, 16]
    assert [p["train_s"] for p in run.points] == [0.25, 0.75]
    run.add_accuracy(0.3)
    run.add_accuracy(0.4)                    # the same step evaluated again (the final full evaluation) replaces it
    assert run.accuracy == [dict(step=2, samples_seen=16, train_s=0.75, accuracy=0.4)]
    assert run.final_accuracy == 0.4


def test_time_and_samples_to_a_target_accuracy():
    run = finished(batch=16, accs=(0.2, 0.6, 0.85))
    assert time_to_target(run, 0.5) == (1.0, 32)
    assert time_to_target(run, 0.85) == (1.5, 48)
    assert time_to_target(run, 0.9) is None


def test_throughput_spread_live_and_finished():
    run = DashboardRun(RunSpec(model="mlp", batch_size=8, lr=0.05), 10)
    for i, rate in enumerate([1.0, 2.0, 10.0, 20.0, 30.0]):
        run.add_step(i + 1, 8, 0.1, rate, 1.0)
    assert throughput_spread(run) == (20.0, 10.0, 30.0)      # warm-up steps left out
    assert throughput_spread(finished(sps=50.0)) == (50.0, 45.0, 55.00000000000001)
    assert throughput_spread(DashboardRun(RunSpec(model="mlp", batch_size=8, lr=0.05), 10)) is None


def test_repeats_that_disagree_are_flagged():
    runs = [finished(accs=(0.83,)), finished(accs=(0.40,)), finished(batch=8, accs=(0.5,))]
    assert repeat_spreads(runs) == {("mlp", 32, "same lr", 4): (0.40, 0.83, 2)}
    (line,) = spread_warnings(runs)
    assert "0.40 to 0.83" in line and "run 2 times" in line
    assert spread_warnings([finished(accs=(0.80,)), finished(accs=(0.82,))]) == []


def test_results_table_has_one_row_per_run_with_units():
    runs = [finished(batch=16, accs=(0.2, 0.9)), finished(batch=64, accs=(0.1, 0.3))]
    runs[1].stopped = True
    table = results_table(runs, 0.8)
    assert list(table["batch"]) == [16, 64] and list(table["state"]) == ["done", "stopped"]
    assert table.loc[0, "s_to_0.80"] == 1.0 and table.loc[0, "samples_to_0.80"] == 32
    assert pd.isna(table.loc[1, "s_to_0.80"])
    assert {"samples/s", "samples/s p10-p90", "predicted_MB", "measured_MB", "lr_rule", "seed"} <= set(table)


def test_knee_of_runs_needs_three_batches_of_that_model():
    runs = [finished(batch=8, sps=100.0), finished(batch=16, sps=180.0), finished(batch=32, sps=190.0)]
    assert knee_of_runs(runs[:2], "mlp") is None
    assert knee_of_runs(runs, "mlp") == 16                   # 180 >= 90% of 190
    assert knee_of_runs(runs, "small_cnn") is None


def test_update_latency():
    run = DashboardRun(RunSpec(model="mlp", batch_size=8, lr=0.05), 10)
    assert update_latency(run) == (None, None)
    run.update_s = [0.8, 1.9, 3.1, 4.0]
    first, between = update_latency(run)
    assert first == 0.8 and between == pytest.approx(1.1)


def test_a_run_reads_its_settings_from_its_one_spec():
    """Model, batch, lr and seed are the RunSpec's, checked once where it was made, never a second copy."""
    from dataclasses import fields

    spec = RunSpec(model="mlp", batch_size=8, lr=0.2, seed=3)
    run = DashboardRun(spec, 10)
    assert (run.model, run.batch_size, run.lr, run.seed, run.label) == ("mlp", 8, 0.2, 3, "mlp bs=8")
    assert not {f.name for f in fields(DashboardRun)} & {f.name for f in fields(RunSpec)}
