"""Notebook 13's exercises: each reference is right on a hand-worked case and each planted mistake is caught."""
import pytest

from labkit.core.exercises import Exercise
from labkit.parallel.tensor import exercises as tpx
from tests.exercise_support import assert_sound


def test_shard_weight_takes_rows_for_column_parallel_and_columns_for_row_parallel():
    w = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert tpx.shard_weight_reference(w, "column", 1, 2) == [[5, 6, 7, 8]]
    assert tpx.shard_weight_reference(w, "row", 1, 2) == [[3, 4], [7, 8]]


def test_tp_bytes_is_four_ring_all_reduces_and_the_notebooks_case_comes_first():
    # b*s*h = 2*8*16 = 256 elements x 4 B = 1024 B per all-reduce; a ring of 2 sends 2(t-1)/t = 1x of it; 4 of them
    assert tpx.tp_bytes_reference(2, 8, 16, 2, 4) == 4 * 1024
    cases = tpx.tp_bytes_cases_for(2, 8, 16, 2)
    assert cases[0] == {"batch": 2, "seq_len": 8, "hidden": 16, "world_size": 2, "bytes_per_element": 4}


def test_the_slow_link_carries_the_groups_that_span_the_nodes():
    assert tpx.slow_link_reference("tp_inside", 100.0, 7.0, 2) == 14.0
    assert tpx.slow_link_reference("dp_inside", 100.0, 7.0, 2) == 200.0
    for mistake in tpx.SLOW_LINK.mistakes:
        assert mistake.answer("tp_inside", 100.0, 7.0, 2) != 14.0


EXERCISES = [v for v in vars(tpx).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)
