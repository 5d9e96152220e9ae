"""The headless ladder's time to the target: every rung gets its time (or "missed", or why it was not timed), the
first rung to reach the target is named in ladder.json and ladder.md, seeded runs give the same answer."""
import dataclasses
import functools
import json
import math

import pytest

from labkit.core.data import load_data
from labkit.core.env import Mode
from labkit.core.models import build_model
from labkit.ladder.config import LadderConfig
from labkit.ladder.first_to_target import (FAST_TARGET, TargetPlan, resolve_target, summary, timed_rounds,
                                           with_time_to_target)
from labkit.ladder.report import LadderResult, LadderRow
from labkit.ladder.rungs import Recipe

PLAN = TargetPlan(0.6, "a test's target", (0, 1, 2), 4, time_compile=False)


def _row(rung, batch, lr, samples_per_s, world_size=1, compile=False, accuracy=0.9):
    recipe = Recipe(batch_size=batch, sync_every_step=False, world_size=world_size, compile=compile)
    return LadderRow(rung, f"r{rung}", f"rung {rung}", "", "", "10", "baseline" if rung == 0 else "faster", "",
                     True, None, batch_size=batch, world_size=world_size, lr=lr, samples_per_s=samples_per_s,
                     val_accuracy=accuracy, startup_s=30.0 if compile else 0.0, recipe=dataclasses.asdict(recipe))


@pytest.fixture(scope="module")
def digits():
    return load_data("digits", image_size=8, train_limit=256, val_limit=100)


def _time(digits, plan=PLAN):
    """Rung 0 learns; rung 1 is fastest per sample but its LR is too small to learn; rung 2 is DDP, rung 3 compiled
    (not timed in fast mode's plan); rung 4 skipped."""
    rows = [_row(0, 16, 0.1, 100.0), _row(1, 32, 1e-6, 900.0), _row(2, 16, 0.1, 800.0, world_size=2),
            _row(3, 16, 0.1, 850.0, compile=True),
            LadderRow(4, "r4", "rung 4", "", "", "10", "skipped", "left out", False, None)]
    result = LadderResult(rows, "CPU", "fast", "mlp", "digits", 256)
    model_fn = functools.partial(build_model, "mlp", digits.num_classes, tuple(digits.image_shape))
    return with_time_to_target(result, LadderConfig.smoke(model="mlp"), digits, plan, model_fn=model_fn)


@pytest.fixture(scope="module")
def timed(digits):
    return _time(digits)


def test_every_rung_gets_its_time_to_the_target_or_says_why_not(timed):
    by_rung = {r.rung: r for r in timed.rows}
    first = by_rung[0]
    assert first.to_target_status == "reached" and 0 < first.time_to_target_s < math.inf
    assert len(first.to_target_seconds) == 3 and all(s is None or s > 0 for s in first.to_target_seconds)
    missed = by_rung[1]                                    # fastest per sample, never gets there: no number
    assert missed.to_target_status == "missed" and missed.time_to_target_s is None
    assert missed.to_target_seconds == [None, None, None] and "cannot be first" in missed.to_target_note
    assert by_rung[2].to_target_status == "not timed" and "multi-process" in by_rung[2].to_target_note
    assert by_rung[3].to_target_status == "not timed" and "compiles again (30 s" in by_rung[3].to_target_note
    assert by_rung[4].to_target_status == "not timed" and by_rung[4].time_to_target_s is None


def test_ladder_json_names_the_first_rung_and_the_target_with_its_source(timed, tmp_path):
    json_path, md_path = timed.save(tmp_path)
    doc = json.loads(json_path.read_text())
    block = doc["to_target"]
    assert (block["target_accuracy"], block["target_source"], block["seeds"]) == (0.6, "a test's target", [0, 1, 2])
    assert block["first_rung"] == 0 and block["fastest_per_sample_rung"] == 1    # the rival: samples/s's crown
    assert block["first_time_s"] == doc["rows"][0]["time_to_target_s"] and block["wall_s"] > 0
    assert doc["rows"][1]["to_target_status"] == "missed" and doc["rows"][1]["time_to_target_s"] is None
    assert LadderResult.from_dict(doc).to_json() == timed.to_json()             # a saved run renders again
    md = md_path.read_text()
    assert "Target: 60.0% validation accuracy (a test's target)" in md
    assert "First to the target: rung 0 (rung 0) reached 60% first" in md
    row_1 = next(line for line in md.splitlines() if line.startswith("| 1. "))
    assert "| missed |" in row_1 and "rung 1 to the target: missed: 3 of 3 seeds" in md


def test_seeded_runs_give_the_same_answer(timed, digits):
    again = _time(digits)
    assert [r.to_target_steps for r in again.rows] == [r.to_target_steps for r in timed.rows]
    assert [r.to_target_status for r in again.rows] == [r.to_target_status for r in timed.rows]
    assert again.to_target["first_rung"] == timed.to_target["first_rung"] == 0


def test_rounds_pair_the_seeds_and_rotate_the_order():
    rows = [_row(r, 16, 0.1, 1.0) for r in range(3)]
    calls = []

    def run(row, seed):
        calls.append((seed, row.rung))
        return None if row.rung == 2 else 7

    out = timed_rounds(rows, [10, 11, 12], run)
    assert calls == [(10, 0), (10, 1), (10, 2), (11, 1), (11, 2), (11, 0), (12, 2), (12, 0), (12, 1)]
    assert [s for _, s in out[0]] == [7, 7, 7] and all(t >= 0 and math.isfinite(t) for t, _ in out[0])
    assert out[2] == [(math.inf, None)] * 3                # a miss is never a time


def _reached(rung, seconds):
    done = [s for s in seconds if s is not None]
    return dataclasses.replace(_row(rung, 16, 0.1, 100.0 * rung + 1), to_target_status="reached",
                               time_to_target_s=sorted(done)[len(done) // 2], to_target_seconds=seconds)


def test_the_first_rung_is_decisive_only_when_it_wins_every_paired_round():
    plan = TargetPlan(0.9, "given", (0, 1, 2))
    block = summary([_reached(0, [1.0, 1.0, 1.0]), _reached(1, [2.0, 2.0, 2.0])], 0.9, "given", plan, 1.0)
    assert block["first_rung"] == 0 and block["rounds_won_over_runner_up"] == 3 and "decisive" not in block["verdict"]
    block = summary([_reached(0, [1.0, 3.0, 1.0]), _reached(1, [2.0, 2.0, 2.0])], 0.9, "given", plan, 0.5)
    assert block["rounds_won_over_runner_up"] == 2 and block["verdict"].endswith("so not decisive on this run")
    none = summary([dataclasses.replace(_row(0, 1, 0.1, 1.0), to_target_status="missed", to_target_seconds=[None] * 3)],
                   0.9, "given", plan, 1.0)
    assert none["first_rung"] is None and none["verdict"] == "no timed rung reached 90% within 20 epochs"


def test_the_target_and_its_source():
    result = LadderResult([_row(0, 1, 0.05, 10.0, accuracy=0.981)], "CPU", "full", "mlp", "digits", 64)
    target, source = resolve_target(TargetPlan(), result, LadderConfig.smoke())
    assert target == 0.96 and source.startswith("rung 0's validation accuracy after the fixed budget (98.1%) less")
    assert resolve_target(TargetPlan(0.7, "--target, as given"), result, LadderConfig.smoke()) == (
        0.7, "--target, as given")
    no_acc = LadderResult([_row(0, 1, 0.05, 10.0, accuracy=None)], "CPU", "full", "mlp", "digits", 64)
    with pytest.raises(ValueError, match="rung 0 has no validation accuracy"):
        resolve_target(TargetPlan(), no_acc, LadderConfig.smoke())


def test_plans_per_mode_and_bad_plans():
    fast, full = TargetPlan.for_mode(Mode("fast", "")), TargetPlan.for_mode(Mode("full", ""))
    assert (fast.target, fast.seeds, fast.max_epochs, fast.time_compile) == (FAST_TARGET, (0, 1, 2), 4, False)
    assert (full.target, len(full.seeds), full.time_compile) == (None, 5, True)
    assert TargetPlan.for_mode(Mode("fast", ""), target=0.9).source == "--target, as given"
    for bad in (dict(target=1.5), dict(target=0.0), dict(seeds=(0, 1)), dict(seeds=(0, 0, 1)), dict(max_epochs=0)):
        with pytest.raises(ValueError):
            TargetPlan(**bad)


def test_a_report_without_the_phase_still_loads_and_says_nothing_of_a_target(fake_result):
    doc = json.loads(fake_result.to_json())
    assert doc["to_target"] is None and all(r["to_target_status"] is None for r in doc["rows"])
    for row in doc["rows"]:                                  # a ladder.json written before the phase existed
        for key in ("to_target_status", "time_to_target_s", "to_target_seconds", "to_target_steps", "to_target_note"):
            del row[key]
    del doc["to_target"]
    old = LadderResult.from_dict(doc)
    assert old.to_target is None and "Target:" not in old.to_markdown()


def test_a_rung_with_loader_workers_leaves_no_process_behind(digits):
    import psutil

    recipe = Recipe(batch_size=16, num_workers=1, prefetch_factor=4, persistent_workers=True)
    row = dataclasses.replace(_row(0, 16, 0.1, 100.0), recipe=dataclasses.asdict(recipe))
    model_fn = functools.partial(build_model, "mlp", digits.num_classes, tuple(digits.image_shape))
    out = with_time_to_target(LadderResult([row], "CPU", "fast", "mlp", "digits", 256), LadderConfig.smoke(model="mlp"),
                              digits, PLAN, model_fn=model_fn)
    assert out.rows[0].to_target_status == "reached"        # three seeds, each with its own worker, all timed
    assert psutil.Process().children(recursive=True) == []


def test_a_ladder_with_no_rung_to_time_says_so(digits):
    rows = [_row(0, 16, 0.1, 100.0, world_size=2)]
    model_fn = functools.partial(build_model, "mlp", digits.num_classes, tuple(digits.image_shape))
    out = with_time_to_target(LadderResult(rows, "CPU", "fast", "mlp", "digits", 256), LadderConfig.smoke(model="mlp"),
                              digits, PLAN, model_fn=model_fn)
    assert out.to_target["first_rung"] is None and out.to_target["fastest_per_sample_rung"] is None
    assert "First to the target: no timed rung reached 60% within 4 epochs  \n" in out.to_markdown()
