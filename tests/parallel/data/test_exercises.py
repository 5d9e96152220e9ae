"""The checked exercises of labkit.parallel.data.exercises: references pass, typical mistakes get their hints."""
import pytest

from labkit.core.exercises import Exercise
from labkit.parallel.data import exercises
from tests.exercise_support import assert_sound

EXERCISES = [v for v in vars(exercises).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_the_measured_case_comes_first_so_the_verdict_shows_it():
    cases = exercises.speedup_cases_for(0.2, 0.05, 2)
    assert cases[0] == {"t_comp_s": 0.2, "t_sync_s": 0.05, "world_size": 2} and len(cases) > 1
