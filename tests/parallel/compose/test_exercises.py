"""Notebook 18's exercises: each reference is right on a hand-worked case and each planted mistake is caught."""
import pytest

from labkit.core.exercises import Exercise
from labkit.parallel.compose import exercises as cx
from tests.exercise_support import assert_sound


def test_dp_group_by_hand():
    assert cx.dp_group_reference(3, dp=2, pp=1, cp=1, tp=2) == [1, 3]
    assert cx.dp_group_reference(5, dp=2, pp=2, cp=1, tp=2) == [1, 5]        # ranks pp * cp * tp = 4 apart


def test_broken_rule_names_the_first_rule_broken():
    base = {"heads": 8, "layers": 8, "seq_len": 64, "batch": 8, "dp": 2, "pp": 2, "cp": 2, "tp": 2}
    assert cx.broken_rule_reference(**base) == "none"
    assert cx.broken_rule_reference(**{**base, "seq_len": 12}) == "seq"       # 12 % (2 x 2*2) != 0
    assert cx.broken_rule_reference(**{**base, "batch": 6, "dp": 4}) == "dp"
    assert {c["seq_len"] for c in cx._broken_rule_cases()} >= {12, 64}


def test_ring_bytes_by_hand_and_the_notebooks_case_first():
    # b=4, s=32 over cp=2, h=64 over tp=2: a K/V block of 2*4*16*32 floats = 16 KiB, passed 3*2-2 = 4 times
    assert cx.ring_bytes_reference(4, 32, 64, 2, 2, 4) == 4 * 16384
    assert cx.ring_bytes_cases_for(4, 32, 64, 2, 2)[0]["seq_len"] == 32


EXERCISES = [v for v in vars(cx).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)
