"""The checked exercises of labkit.tf.exercises: references pass, typical mistakes get their hints."""
import pytest

from labkit.core.exercises import Exercise
from labkit.tf import exercises
from tests.exercise_support import assert_sound

EXERCISES = [v for v in vars(exercises).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_loss_scale_rule_is_torchs_gradscaler_update():
    """The torch-free reference equals the kernel torch.amp.GradScaler.update runs (growth 2, backoff 0.5)."""
    torch = pytest.importorskip("torch")
    for case in exercises.LOSS_SCALE.cases():
        scale = torch.tensor([case["scale"]])
        tracker = torch.tensor([case["good_steps"]], dtype=torch.int32)
        found_inf = torch.tensor([0.0 if case["grads_finite"] else 1.0])
        torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, case["growth_interval"])
        assert exercises.loss_scale_reference(**case) == (scale.item(), tracker.item()), case
