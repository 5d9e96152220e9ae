"""Notebook 14's exercises: each reference right on a hand-worked case, sound (reference passes, each mistake caught
with its hint, an empty stub not attempted)."""
import pytest

from labkit.plan import exercises as ex
from tests.exercise_support import assert_sound

GIB = 2**30


@pytest.mark.parametrize("exercise", [ex.PICK_TP, ex.ZERO3_TP, ex.TP_LAYER_SECONDS], ids=lambda e: e.key)
def test_each_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_pick_tp_by_hand():
    # 100 GiB state + 20 GiB split activations, 4 GiB replicated, 40 GiB cards: tp=4 gives 30 + 4 = 34 GiB
    assert ex.pick_tp_reference(100 * GIB, 20 * GIB, 4 * GIB, 40 * GIB, 32, 8) == 4
    assert ex.pick_tp_reference(1000 * GIB, 0, 0, 40 * GIB, 32, 8) == 0
    assert ex.pick_tp_reference(100 * GIB, 20 * GIB, 4 * GIB, 40 * GIB, 24, 8) == 4
    assert ex.pick_tp_reference(100 * GIB, 20 * GIB, 4 * GIB, 40 * GIB, 12, 8) == 4


def test_zero3_tp_and_tp_seconds_by_hand():
    assert ex.zero3_tp_reference(8 * 10**9, 8, 16) == 16 * 10**9 // 16
    one_gb = ex.tp_layer_seconds_reference(1, 1000, 500, 2, 8, 1e9, 1e8)   # 1 MB buffer, ring of 2 sends 1 MB
    assert one_gb == pytest.approx(4 * 1e6 / 1e9)
    assert ex.tp_layer_seconds_reference(1, 1000, 500, 16, 8, 1e9, 1e8) > 10 * one_gb
