"""Notebook 02b's exercises: references pass, each typical mistake gets its hint, the references are the kit's."""
import pytest

from labkit.training import exercises
from labkit.training.target_exercises import CRITICAL_BATCH, NOISE_SCALE, b_crit_reference, b_simple_reference
from tests.exercise_support import assert_sound


@pytest.mark.parametrize("exercise", [NOISE_SCALE, CRITICAL_BATCH], ids=lambda e: e.key)
def test_sound_and_checked_as_ex(exercise):
    assert_sound(exercise)
    assert exercise in vars(exercises).values()


def test_references_on_hand_numbers():
    assert b_simple_reference(0.5 + 40 / 4, 0.5 + 40 / 32, 4, 32) == pytest.approx(80)
    bs = [8, 16, 32, 64]
    steps = [10 * (1 + 50 / b) for b in bs]
    assert b_crit_reference(steps, [b * s for b, s in zip(bs, steps)]) == pytest.approx(50)
