"""Hostile answers against EVERY registered exercise (issue 36): the checker judges the learner's function on
private copies, under a time limit, catching whatever it raises or prints, types before values, whole numbers
exactly, and on fresh cases a lookup table of the shown ones cannot pass.

The exercises are found by walking ``labkit.*.exercises`` (tests/exercise_support.py), so one a new notebook
adds is covered here when it is merged. Limits are kept short so the whole file costs a few seconds of CPU."""
from __future__ import annotations

import copy
import dataclasses
import math
import sys
import time

import pytest

from labkit.core import guard
from labkit.core.answers import plain
from labkit.core.exercises import CORRECT, WRONG, Exercise, judge
from tests.exercise_support import all_exercises

EXERCISES = all_exercises()
LIMIT_S = 0.3                   # each hostile check's whole time budget; correct answers take milliseconds
SEED = 12345                    # fixed fresh-case seed, so a failure here is reproducible


@pytest.fixture(autouse=True)
def short_grace(monkeypatch):
    monkeypatch.setattr(guard, "GRACE_S", 0.1)


def quiet(exercise: Exercise) -> Exercise:
    """The exercise without its live measurement (a DataLoader or a tiny training run): judged on cases only."""
    return dataclasses.replace(exercise, measure=None)


def check(exercise: Exercise, answer, limit_s: float = LIMIT_S):
    return judge(quiet(exercise), answer, time_limit_s=limit_s, seed=SEED)


def mutate(value) -> None:
    """Empty every container reachable from the value, in place (what 'clear the input' answers do)."""
    if isinstance(value, dict):
        for v in list(value.values()):
            mutate(v)
        value.clear()
    elif isinstance(value, list):
        for v in value:
            mutate(v)
        value.clear()


def nan_like(value):
    """The reference's answer with every number replaced by NaN (same shape)."""
    if isinstance(value, (list, tuple)):
        return type(value)(nan_like(v) for v in value)
    if isinstance(value, dict):
        return {k: nan_like(v) for k, v in value.items()}
    return math.nan if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def takes_args(exercise: Exercise) -> bool:
    return any(exercise.cases())


def test_every_exercise_is_found():
    assert len(EXERCISES) >= 25 and len({e.key for e in EXERCISES}) == len(EXERCISES)


ids = [e.key for e in EXERCISES]


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
def test_a_wrong_answer_that_empties_its_inputs_is_still_wrong_with_its_hint(exercise):
    mistake = exercise.mistakes[0]

    def answer(**kwargs):
        result = mistake.answer(**copy.deepcopy(kwargs))
        mutate(kwargs)
        return result

    verdict = check(exercise, answer)
    assert verdict.status == WRONG and verdict.mistake == mistake.name, verdict.text


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
def test_a_correct_answer_that_changes_its_inputs_is_accepted(exercise):
    def answer(**kwargs):
        result = exercise.reference(**kwargs)
        mutate(kwargs)
        return result

    verdict = check(exercise, answer)
    assert verdict.status == CORRECT, verdict.text


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt])
def test_exit_and_interrupt_raised_by_the_answer_are_its_own(exercise, kind):
    def answer(**kwargs):
        raise kind(3)

    verdict = check(exercise, answer)
    assert verdict.status == WRONG and f"your code raised {kind.__name__}" in verdict.text, verdict.text


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
@pytest.mark.parametrize("how", ["sleep", "loop"])
def test_a_sleeping_or_looping_answer_is_stopped(exercise, how):
    def answer(**kwargs):
        if how == "sleep":
            time.sleep(30)
        while True:
            pass

    start = time.perf_counter()
    verdict = check(exercise, answer)
    assert time.perf_counter() - start < LIMIT_S + 1.5     # the limit, the grace, and a busy machine's slack
    assert verdict.status == WRONG and "did not return within" in verdict.text, verdict.text


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
def test_a_print_flood_is_captured_and_capped(exercise, capsys):
    flooded = []

    def answer(**kwargs):
        if not flooded:                              # 2 MB once: enough to flood a cell, cheap to judge
            flooded.append(True)
            for _ in range(2_000):
                print("x" * 1_000)
            print("warning", file=sys.stderr)
        return exercise.reference(**kwargs)

    verdict = check(exercise, answer, limit_s=3.0)
    out = capsys.readouterr()
    assert verdict.status == CORRECT, verdict.text
    assert out.out == "" and out.err == "" and len(verdict.text) < 2_500
    assert "printed" in verdict.text and "characters" in verdict.text


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
@pytest.mark.parametrize("fake", ["str", "nan"])
def test_wrong_types_and_nan_are_wrong(exercise, fake):
    sample = plain(exercise.reference(**exercise.cases()[0]))
    if fake == "nan" and repr(nan_like(sample)) == repr(sample):
        pytest.skip(f"{exercise.key} answers no number to replace by NaN")
    def answer(**kwargs):
        right = plain(exercise.reference(**kwargs))
        return str(right) if fake == "str" else nan_like(right)

    verdict = check(exercise, answer)
    assert verdict.status == WRONG, verdict.text


def first_int_changed(value, change):
    """The value with its first whole-number leaf passed through ``change``; None when it has none."""
    if type(value) is int:
        return change(value)
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value)) \
        if isinstance(value, (list, tuple)) else []
    for key, item in items:
        changed = first_int_changed(item, change)
        if changed is not None:
            copy_ = dict(value) if isinstance(value, dict) else list(value)
            copy_[key] = changed
            return copy_
    return None


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
def test_whole_number_answers_compare_exactly(exercise):
    if first_int_changed(plain(exercise.reference(**exercise.cases()[0])), lambda v: v) is None:
        pytest.skip(f"{exercise.key} answers no whole number")
    changes = {"off by one": lambda v: v + 1, "a bool": lambda v: v != 0, "a str": str,
               "a float a hair off": lambda v: float(v) * (1 + 1e-9) + 0.5}
    for name, change in changes.items():
        verdict = check(exercise, lambda **kw: first_int_changed(plain(exercise.reference(**kw)), change))
        assert verdict.status == WRONG, f"{name}: {verdict.text}"
    exact = check(exercise, lambda **kw: first_int_changed(plain(exercise.reference(**kw)), float))
    assert exact.status == CORRECT, f"an exact whole float is a right count: {exact.text}"


@pytest.mark.parametrize("exercise", [e for e in EXERCISES if takes_args(e)], ids=[e.key for e in EXERCISES
                                                                                    if takes_args(e)])
def test_the_first_shown_answer_hard_coded_and_a_table_of_shown_answers_fail(exercise):
    shown = exercise.cases()
    first = plain(exercise.reference(**shown[0]))
    assert len({repr(plain(exercise.reference(**c))) for c in shown}) > 1, "cases that all share one answer"
    assert check(exercise, lambda **kwargs: first).status == WRONG
    table = [(c, plain(exercise.reference(**copy.deepcopy(c)))) for c in shown]

    def lookup(**kwargs):
        for case, value in table:
            if case == kwargs:
                return value
        return first

    verdict = check(exercise, lookup)
    assert verdict.status == WRONG and "fresh cases" in verdict.text, verdict.text
