"""The exercise checker: three verdicts, hints aimed at the mistake made, the learner's errors shown as theirs."""
import json
import statistics

import pytest

from labkit.core.exercises import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise, ExerciseBook, Mistake, judge,
                                   summarize_exercise_log)
from labkit.core.lessons import summarize_lesson_log


def double(x: int) -> int:
    """Twice x."""
    return 2 * x


DOUBLE = Exercise("double", "twice x", double, lambda: [{"x": 1}, {"x": 5}, {"x": -3}],
                  (Mistake("square", lambda x: x * x, "doubling is x + x, not x * x"),), "multiply by two")


def test_unfilled_stubs_are_not_attempted():
    def stub(x):
        ...

    for answer in (None, ..., stub):
        verdict = judge(DOUBLE, answer)
        assert verdict.status == NOT_ATTEMPTED and "not attempted yet" in verdict.text


def test_correct_answer_shows_the_numbers():
    verdict = judge(DOUBLE, lambda x: x + x)
    assert verdict.status == CORRECT and "correct on all 3 cases" in verdict.text and "x=1 -> 2" in verdict.text


def test_typical_mistake_gets_its_hint_and_unknown_mistake_the_general_one():
    square = judge(DOUBLE, lambda x: x * x)
    assert square.status == WRONG and square.mistake == "square" and "x + x, not x * x" in square.text
    other = judge(DOUBLE, lambda x: x + 1)
    assert other.status == WRONG and other.mistake is None and "multiply by two" in other.text
    assert "you gave" in other.text and "reference gives" in other.text


def test_learner_exception_is_one_short_block_naming_their_line():
    def broken(x):
        return x / 0

    verdict = judge(DOUBLE, broken)
    assert verdict.status == WRONG
    assert "your code raised ZeroDivisionError" in verdict.text and "return x / 0" in verdict.text
    assert "Traceback" not in verdict.text and len(verdict.text.splitlines()) == 2


def test_values_are_judged_for_value_exercises():
    answer = Exercise("k", "the constant 3", lambda: 3, lambda: [{}], (Mistake("two", lambda: 2, "off by one"),), "h")
    assert judge(answer, 3).status == CORRECT
    assert judge(answer, 2).mistake == "two"


def test_floats_compare_with_tolerance_and_types_matter():
    half = Exercise("h", "x/2", lambda x: x / 2, lambda: [{"x": 1.0}, {"x": 3.0}],
                    (Mistake("int", lambda x: x // 2, "use true division"),), "divide")
    assert judge(half, lambda x: x * 0.5 + 1e-12).status == CORRECT
    assert judge(half, lambda x: x // 2).mistake == "int"
    pair = Exercise("p", "pair", lambda a: (a, a + 1), lambda: [{"a": 1}],
                    (Mistake("swap", lambda a: (a + 1, a), "order"),), "pair")
    assert judge(pair, lambda a: [a, a + 1]).status == CORRECT
    assert judge(pair, lambda a: "1, 2").status == WRONG


def test_exercise_needs_a_mistake_and_a_hint():
    with pytest.raises(ValueError, match="typical mistake"):
        Exercise("x", "task", double, lambda: [{"x": 1}], (), "hint")
    with pytest.raises(ValueError, match="general hint"):
        Exercise("x", "task", double, lambda: [{"x": 1}], DOUBLE.mistakes, " ")


def test_book_prints_verdicts_and_a_separate_tally(capsys, tmp_path, monkeypatch):
    log = tmp_path / "lessons.jsonl"
    monkeypatch.setenv("LABKIT_LESSON_LOG", str(log))
    book = ExerciseBook("demo")
    book.check(DOUBLE, None)
    book.check(DOUBLE, lambda x: 2 * x)
    book.check(Exercise("sq", "x*x", lambda x: x * x, lambda: [{"x": 3}],
                        (Mistake("double", double, "square, not double"),), "h"), double)
    assert book.tally() == "demo: exercises: 2 of 2 attempted, 1 correct"
    out = capsys.readouterr().out
    assert "[double] not attempted yet" in out and "[double] correct" in out and "square, not double" in out
    with open(log, "a") as f:
        f.write(json.dumps({"notebook": "demo", "checked": ["a"], "not_checked": {}}) + "\n")
    assert summarize_exercise_log(log) == "exercises: 2 of 2 attempted, 1 correct in 1 notebooks"
    assert summarize_lesson_log(log).startswith("lessons: 1 of 1 checked in 1 notebooks")


def test_a_failing_check_says_so_in_one_line(capsys):
    broken = Exercise("b", "t", lambda x: 1 / 0, lambda: [{"x": 1}], (Mistake("m", lambda x: 0, "h"),), "h")
    ExerciseBook("demo").check(broken, lambda x: 1)
    out = capsys.readouterr().out
    assert "the check itself failed (ZeroDivisionError" in out and "Traceback" not in out


def test_reveal_prints_the_reference(capsys):
    ExerciseBook("demo").reveal(DOUBLE)
    out = capsys.readouterr().out
    assert "reference for [double]" in out and "return 2 * x" in out


def test_a_renamed_argument_is_explained_and_numpy_answers_are_accepted():
    verdict = judge(DOUBLE, lambda y: 2 * y)
    assert verdict.status == WRONG and "cannot be called as f(x)" in verdict.text and "argument names" in verdict.text
    np = pytest.importorskip("numpy")
    assert judge(DOUBLE, lambda x: np.int64(2 * x)).status == CORRECT
    pair = Exercise("p", "pair", lambda a: (a, a + 1), lambda: [{"a": 1}], (Mistake("s", lambda a: (a + 1, a), "o"),), "h")
    assert judge(pair, lambda a: np.array([a, a + 1])).status == CORRECT


def _seeded_cases(seed: int = 0) -> list[dict]:
    return [{"xs": [seed + i, 2 * i + 1, 7]} for i in range(3)]


def _total(xs: list) -> int:
    """Sum of xs."""
    return sum(xs)


def _measure_mean(fn) -> str:
    data = [1.0, 2.0, 3.0]
    total = fn(xs=data)
    return f"mean {total / len(data):.2f} of {len(data)} values, median {statistics.median(data)}"


TOTAL = Exercise("total", "the sum", _total, _seeded_cases, (Mistake("len", lambda xs: len(xs), "add them"),),
                 "add the values", measure=_measure_mean)


def test_measure_sees_guarded_calls_a_mutating_right_answer_passes_and_a_fault_there_is_the_learners():
    def empties(xs):
        result = sum(xs)
        xs.clear()
        return result

    ok = judge(TOTAL, empties)
    assert ok.status == CORRECT and "measured: mean 2.00 of 3 values" in ok.text

    calls = []

    def fails_live(xs):
        calls.append(1)
        if len(calls) > 6:              # right on the 6 judged cases, raises on the measured one
            raise KeyError("live")
        return sum(xs)

    verdict = judge(TOTAL, fails_live, seed=1)
    assert verdict.status == WRONG and "your code raised KeyError" in verdict.text and "live measurement" in verdict.text
    assert "check itself failed" not in verdict.text


def test_fresh_cases_catch_a_table_of_shown_answers_without_revealing_their_values():
    table = {repr(c["xs"]): _total(**c) for c in _seeded_cases()}
    verdict = judge(TOTAL, lambda xs: table.get(repr(xs), 0), seed=99)
    assert verdict.status == WRONG and "fresh cases" in verdict.text and "seed 99" in verdict.text
    assert "reference gives" not in verdict.text


def test_the_reference_never_sees_the_learners_changes_and_is_computed_first():
    seen = []
    spy = Exercise("spy", "t", lambda xs: seen.append(list(xs)) or sum(xs), lambda: [{"xs": [1, 2]}],
                   (Mistake("m", lambda xs: 0, "h"),), "h")
    judge(spy, lambda xs: xs.clear() or 3)
    assert seen == [[1, 2]]


def test_a_number_as_a_string_is_wrong_and_says_so():
    verdict = judge(DOUBLE, lambda x: str(2 * x))
    assert verdict.status == WRONG and "a str, not a number" in verdict.text
