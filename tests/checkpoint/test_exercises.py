import torch

from labkit.checkpoint import exercises as ex
from labkit.core.exercises import CORRECT, judge
from tests.exercise_support import assert_sound


def test_shard_reference_is_torch_chunk_on_every_case():
    for case in ex._shard_cases() + ex._shard_cases(seed=5):
        chunks = torch.arange(case["rows"]).chunk(case["world_size"])
        rows = chunks[case["rank"]].tolist() if case["rank"] < len(chunks) else []
        start, stop = ex.shard_rows_reference(**case)
        assert list(range(start, stop)) == rows, case


def test_shard_reference_matches_what_dtensor_gave_three_ranks(runs):
    full = {k: v.shape[0] for k, v in runs["saved"][0]["saved_state"]["model"].items()}
    cases = ex.measured_shard_cases(runs["resumed"][3], full)
    assert any(c["rows"] % 3 for c in cases)              # an uneven split is among them (8 rows: 3, 3, 2)
    for case in cases:
        start, stop = ex.shard_rows_reference(case["rows"], case["world_size"], case["rank"])
        assert stop - start == case["measured_rows"], case


def test_exercises_accept_the_reference_and_name_each_mistake():
    for exercise in (ex.SHARD_ROWS, ex.BEST_INTERVAL):
        assert_sound(exercise)


def test_interval_cases_start_from_the_measured_save_time():
    cases = ex.interval_cases_for(0.5)
    assert cases[0]["save_cost_s"] == 0.5
    assert judge(ex.BEST_INTERVAL, ex.interval_reference, cases).status == CORRECT
