"""The checked exercises of labkit.parallel.debug.exercises: references pass, typical mistakes get their hints."""
import pytest

from labkit.core.exercises import Exercise
from labkit.parallel.debug import exercises
from tests.exercise_support import assert_sound

EXERCISES = [v for v in vars(exercises).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)
