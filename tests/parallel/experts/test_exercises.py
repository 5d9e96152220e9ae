"""Notebook 15's exercises: each reference is right on a hand-worked case and each planted mistake is caught."""
import pytest

from labkit.core.exercises import Exercise
from labkit.parallel.experts import exercises as epx
from tests.exercise_support import assert_sound


def test_kept_per_expert_caps_at_the_rounded_up_capacity():
    # capacity = ceil(1.25 x 10 x 2 / 4) = ceil(6.25) = 7
    assert epx.kept_per_expert_reference([9, 5, 3, 3], 10, 2, 1.25) == [7, 5, 3, 3]
    assert epx.kept_cases_for([9, 5, 3, 3], 10, 2, 1.25)[0]["routed"] == [9, 5, 3, 3]


def test_a2a_bytes_counts_both_directions_twice_without_the_own_block():
    # rank 1 sends 4 + 6 rows away in dispatch, returns 2 + 3 in combine: 15 rows x 8 h x 2 B x 2 (backward)
    assert epx.a2a_bytes_reference(1, [4, 9, 6], [2, 7, 3], 8, 2) == 15 * 16 * 2


EXERCISES = [v for v in vars(epx).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)
