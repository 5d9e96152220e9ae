"""Hostile answers against EVERY registered exercise (issue 36): the checker judges the learner's function on
private copies, under a time limit, catching whatever it raises or prints, types before values, whole numbers
exactly, and on fresh cases a lookup table of the shown ones cannot pass. Issue 53 added: a right Fraction or
Decimal is right, a number too large for a float is wrong (not a failed check), and the answer's own code (its
exception's message, its signature, its __del__) runs under the limit and always ends in a verdict.

The exercises are found by walking ``labkit.*.exercises`` (tests/exercise_support.py), so one a new notebook
adds is covered here when it is merged. Limits are kept short so the whole file costs a few seconds of CPU."""
from __future__ import annotations

import copy
import dataclasses
import decimal
import fractions
import math
import sys
import threading
import time
from pathlib import Path

import pytest

from labkit.core import exercises, guard
from labkit.core.answers import plain
from labkit.core.exercises import CORRECT, WRONG, Exercise, ExerciseBook, judge
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
    if fake == "str" and isinstance(sample, str):
        pytest.skip(f"{exercise.key} answers a word: its right answer already is a string")
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


# ---------------------------------------------------------------- issue 53: every answer gets a verdict
def numeric_leaves_as(value, kind):
    """The answer with each number (not bools, not NaN/inf) turned into ``kind``: Fraction or Decimal."""
    if isinstance(value, (list, tuple)):
        return type(value)(numeric_leaves_as(v, kind) for v in value)
    if isinstance(value, dict):
        return {k: numeric_leaves_as(v, kind) for k, v in value.items()}
    if type(value) in (int, float) and math.isfinite(value):
        return kind(repr(value)) if kind is decimal.Decimal else kind(value)
    return value


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
@pytest.mark.parametrize("kind", [fractions.Fraction, decimal.Decimal], ids=["Fraction", "Decimal"])
def test_a_right_fraction_or_decimal_is_right(exercise, kind):
    verdict = check(exercise, lambda **kw: numeric_leaves_as(plain(exercise.reference(**kw)), kind))
    assert verdict.status == CORRECT, verdict.text


@pytest.mark.parametrize("exercise", EXERCISES, ids=ids)
@pytest.mark.parametrize("huge", [10 ** 400, -10 ** 400, math.inf, [10 ** 400]], ids=["big", "-big", "inf", "[big]"])
def test_a_number_too_large_for_a_float_is_wrong_not_a_failed_check(exercise, huge, capsys):
    book = ExerciseBook("hostile")
    book.check(quiet(exercise), lambda **kw: huge)
    verdict = book.verdicts[exercise.key]
    assert verdict.status == WRONG and "the check itself failed" not in verdict.text, verdict.text
    assert capsys.readouterr().out.strip() == verdict.text


class MessageExits(Exception):
    def __str__(self):
        raise SystemExit("from __str__")


class MessageLoops(Exception):
    def __str__(self):
        while True:
            pass


class SignatureLoops:
    @property
    def __signature__(self):
        while True:
            pass

    def __call__(self, **kwargs):
        return 0


class SignatureExits(SignatureLoops):
    @property
    def __signature__(self):
        raise SystemExit(2)


class DelLoops:
    def __del__(self):
        while True:
            pass


class Deleted:
    threads: list = []

    def __del__(self):
        Deleted.threads.append(threading.current_thread().name)


def raiser(kind):
    def answer(**kwargs):
        raise kind()
    return answer


SAMPLE = [e for e in EXERCISES if e.key in ("noise_scale_from_norms", "pick_tp", "busbw_gb_s")] or EXERCISES[:3]


@pytest.mark.parametrize("exercise", SAMPLE, ids=[e.key for e in SAMPLE])
@pytest.mark.parametrize("answer, says", [
    (raiser(MessageExits), "its __str__ raised SystemExit"),
    (raiser(MessageLoops), "did not return within"),
    (SignatureLoops(), "did not return within"),
    (SignatureExits(), "your code raised SystemExit"),
    pytest.param(lambda **kw: DelLoops(), "did not return within", marks=pytest.mark.filterwarnings(
        "ignore::pytest.PytestUnraisableExceptionWarning")),       # Python reports the stop inside __del__ so
], ids=["str-exits", "str-loops", "signature-loops", "signature-exits", "del-loops"])
def test_the_answers_own_code_runs_under_the_limit_and_always_gets_a_verdict(exercise, answer, says, capsys):
    """Found: an answer's __del__, its exception's __str__ and its __signature__ ran outside the time limit, and a
    SystemExit from __str__ escaped the check with no verdict."""
    book = ExerciseBook("hostile")
    start = time.perf_counter()
    book.check(dataclasses.replace(quiet(exercise), time_limit_s=LIMIT_S), answer)
    assert time.perf_counter() - start < LIMIT_S + 1.5     # the limit, the grace, and a busy machine's slack
    verdict = book.verdicts[exercise.key]
    assert verdict.status == WRONG and says in verdict.text, verdict.text
    assert capsys.readouterr().out.strip() == verdict.text


def test_what_the_answer_returned_is_freed_in_its_own_thread_and_never_compared_by_its_methods():
    exercise = quiet(SAMPLE[0])
    Deleted.threads.clear()
    verdict = check(exercise, lambda **kw: Deleted())
    assert verdict.status == WRONG and "a Deleted, not a number" in verdict.text, verdict.text
    assert Deleted.threads and set(Deleted.threads) == {"labkit-exercise-answer"}, Deleted.threads


def test_the_readme_states_what_the_check_guards_and_what_it_cannot():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Exercises that check themselves", 1)[1].split("\n## ", 1)[0]
    assert "cannot be fooled" not in section
    for limit in ("sys._current_frames()", "labkit.core.exercises.mismatch", "sum(range(10**9))", "os._exit()"):
        assert limit in section, f"the README does not name {limit}"


def test_the_stated_limit_is_real_an_answer_in_the_same_process_can_replace_the_comparison(monkeypatch):
    """What the README says is not guarded, shown: if this ever fails, the answer is isolated; say so there."""
    exercise = quiet(SAMPLE[0])

    def cheat(**kwargs):
        exercises.mismatch = lambda got, want, rel_tol: None
        return 0.0

    monkeypatch.setattr(exercises, "mismatch", exercises.mismatch)     # restored after the test
    assert check(exercise, cheat).status == CORRECT
