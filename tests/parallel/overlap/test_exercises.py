"""Notebook 17's exercises: references right on hand-worked cases, each planted mistake caught with its hint."""
import pytest

from labkit.core.exercises import Exercise
from labkit.parallel.overlap import exercises as ovx
from tests.exercise_support import assert_sound


def test_exposed_reference_on_a_hand_worked_step():
    # ready 2, 5, 10; comm 5 each; backward 10 -> ends 7, 12, 17 -> 7 exposed
    assert ovx.exposed_reference([2.0, 5.0, 10.0], [5.0, 5.0, 5.0], 10.0) == 7.0
    assert ovx.exposed_reference([1.0, 2.0], [1.0, 1.0], 10.0) == 0.0


def test_the_measured_step_comes_first_in_ms():
    step = {"backward_s": 0.010, "buckets": [(1, 100, 0.006, 0.012), (0, 100, 0.002, 0.005)]}
    first = ovx.exposed_cases_for(step)[0]
    assert first == {"ready_ms": [2.0, 6.0], "comm_ms": [3.0, 6.0], "backward_ms": 10.0}


def test_buckets_reference_is_the_hand_written_sync_s():
    assert ovx.buckets_reference([100, 300, 50, 400], 350) == [[3], [2, 1], [0]]


EXERCISES = [v for v in vars(ovx).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)
