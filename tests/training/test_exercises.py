"""The checked exercises of labkit.training.exercises: references pass, typical mistakes get their hints."""
import pytest

from labkit.core.exercises import Exercise
from labkit.training import exercises
from tests.exercise_support import assert_sound

EXERCISES = [v for v in vars(exercises).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_the_warmup_check_trains_with_the_kits_step_and_shows_disagreement():
    assert "your function gives the same" in exercises.lr_in_training(exercises.WARMUP_LR.reference)
    wrong = exercises.lr_in_training(exercises.WARMUP_LR.mistakes[0].answer)
    assert "yours gives" in wrong and "0.02, 0.065" in wrong


def test_live_cases_include_the_notebooks_numbers():
    cases = exercises.adam_cases_for(1234, 5678)
    assert cases[0] == {"num_params": 1234, "saved_activation_bytes": 5678, "bytes_per_value": 4}
    assert exercises.steady_cases_for([0.5, 0.1, 0.1], 8, 1)[0]["step_times_s"] == [0.5, 0.1, 0.1]
    random_only = len(exercises._step_time_cases())
    assert len(exercises.steady_cases_for([float("nan"), 0.1], 8, 0)) == random_only     # unusable: left out
