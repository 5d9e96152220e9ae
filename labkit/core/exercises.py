"""Exercises that check themselves: the learner's code, run against the kit's reference, gets a verdict.

An :class:`Exercise` names a reference (the kit's own function, or a short one next to the lesson code it
exercises), the cases to run on (random sizes, world sizes, or the numbers the notebook just measured) and the
typical wrong answers (:class:`Mistake`), each with the hint aimed at it. :func:`judge` runs the learner's
answer and returns one of three verdicts: not attempted yet (the stub is still ``...``), correct (with the
numbers of the first case, and what a live ``measure`` found), or wrong (with the hint of the mistake the answer
matches, else the first case it got wrong). An exception raised by the learner's code is reported as theirs, in
one short block, never as a traceback of the check. :class:`ExerciseBook` is one notebook's tally, kept apart
from the lesson tally (``exercises: 3 of 27 attempted, 2 correct``), and ``reveal`` prints a reference.

Why not otter-grader or nbgrader: see the README's "Exercises" section. Torch-free.
"""
from __future__ import annotations

import inspect
import math
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from labkit.core.lessons import LessonLogError, append_to_lesson_log, last_record_per_notebook

NOT_ATTEMPTED, CORRECT, WRONG = "not attempted yet", "correct", "wrong"
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer, written as code, and the hint a learner who made it should read."""

    name: str
    answer: Callable[..., Any]
    hint: str


@dataclass(frozen=True)
class Exercise:
    """One checked exercise: the task, the reference, the cases it is judged on and the typical mistakes.

    ``cases`` returns a list of keyword-argument dicts (seeded, so a verdict is reproducible); ``measure``
    (optional) runs after a correct answer and returns a line of live numbers for the verdict.
    """

    key: str
    task: str
    reference: Callable[..., Any]
    cases: Callable[[], list[dict]]
    mistakes: tuple[Mistake, ...]
    hint: str
    rel_tol: float = 1e-6
    measure: Callable[[Callable[..., Any]], str] | None = None

    def __post_init__(self) -> None:
        if not self.key or not self.task.strip() or not self.hint.strip():
            raise ValueError("an exercise needs a key, a task and a general hint")
        if not self.mistakes:
            raise ValueError(f"exercise {self.key!r} needs at least one typical mistake, with its hint")


@dataclass(frozen=True)
class Verdict:
    """What the check says: ``status`` is one of not attempted yet / correct / wrong; ``text`` the message."""

    key: str
    status: str
    text: str
    mistake: str | None = None

    def __str__(self) -> str:
        return self.text


def _same(got: Any, want: Any, rel_tol: float) -> bool:
    """Equal for ints, strings, bools and None; close (relative ``rel_tol``) for floats; elementwise for sequences."""
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(
            _same(got[k], want[k], rel_tol) for k in want)
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
            _same(g, w, rel_tol) for g, w in zip(got, want))
    if isinstance(want, bool) or isinstance(got, bool) or isinstance(want, str):
        return got == want
    if isinstance(want, (int, float)):
        try:
            return math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return bool(got == want)


def _show(value: Any, width: int = 70) -> str:
    """A short, readable rendering of a case's value (floats to 6 digits, long values cut)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict) and isinstance(value.get("traceEvents"), list):
        return f"<trace of {len(value['traceEvents'])} events>"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"[{', '.join(_show(v) for v in value[:8])}, ... ({len(value)} items)]"
    text = repr(value)
    return text if len(text) <= width else text[:width - 5] + " ...]"


def _args(case: dict) -> str:
    return ", ".join(f"{k}={_show(v)}" for k, v in case.items())


def learner_error(err: BaseException) -> str:
    """The learner's exception in one short block: its type, message and the learner's own line that raised it."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(_PACKAGE_DIR)]
    where = ""
    if frames:
        last = frames[-1]
        where = f"\n  in your code, line {last.lineno}: {(last.line or '').strip()}"
    return f"your code raised {type(err).__name__}: {err}{where}"


def _unfilled(answer: Any) -> bool:
    return answer is None or answer is Ellipsis


class _LearnerError(Exception):
    """Carries an exception raised inside the learner's code out of the comparison loop."""


def _run(answer: Callable[..., Any], case: dict) -> Any:
    try:
        got = answer(**case)
    except TypeError as err:
        if not traceback.extract_tb(err.__traceback__)[1:]:      # the call itself failed: the signature differs
            raise _LearnerError(f"your function cannot be called as f({', '.join(case)}): {err}; keep the stub's "
                                "argument names") from None
        raise _LearnerError(learner_error(err)) from None
    except Exception as err:  # the learner's code: any exception is theirs to see, in one block
        raise _LearnerError(learner_error(err)) from None
    return got.tolist() if hasattr(got, "tolist") and not isinstance(got, (int, float)) else got


def _matching_mistake(exercise: Exercise, cases: list[dict], got: list[Any]) -> Mistake | None:
    for mistake in exercise.mistakes:
        if all(_same(g, mistake.answer(**c), exercise.rel_tol) for g, c in zip(got, cases)):
            return mistake
    return None


def judge(exercise: Exercise, answer: Any, cases: Sequence[dict] | None = None) -> Verdict:
    """Run ``answer`` (a function, or a value for a no-argument exercise) on the cases and return the verdict."""
    head = f"[{exercise.key}]"
    fn = answer if callable(answer) else (lambda **_: answer)
    if _unfilled(answer):
        return Verdict(exercise.key, NOT_ATTEMPTED, f"{head} not attempted yet: {exercise.task}")
    cases = list(cases) if cases is not None else exercise.cases()
    try:
        got = [_run(fn, c) for c in cases]
    except _LearnerError as err:
        return Verdict(exercise.key, WRONG, f"{head} wrong: {err}")
    if all(_unfilled(g) for g in got):
        return Verdict(exercise.key, NOT_ATTEMPTED, f"{head} not attempted yet (your function returns nothing): "
                                                    f"{exercise.task}")
    want = [exercise.reference(**c) for c in cases]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if not _same(g, w, exercise.rel_tol)]
    if not bad:
        live = ""
        if exercise.measure is not None:
            live = "\n  measured: " + exercise.measure(fn)
        return Verdict(exercise.key, CORRECT, f"{head} correct on all {len(cases)} cases, e.g. "
                                              f"{_args(cases[0])} -> {_show(got[0])}{live}")
    first = bad[0]
    mistake = _matching_mistake(exercise, cases, got)
    hint = mistake.hint if mistake else exercise.hint
    return Verdict(exercise.key, WRONG, f"{head} wrong on {len(bad)} of {len(cases)} cases; e.g. "
                                        f"{_args(cases[first])}: you gave {_show(got[first])}, the kit's reference "
                                        f"gives {_show(want[first])}\n  hint: {hint}",
                   mistake.name if mistake else None)


def reference_source(exercise: Exercise) -> str:
    """The reference solution's source code, for a learner who asks for it."""
    try:
        return inspect.getsource(exercise.reference)
    except (OSError, TypeError):
        return f"{exercise.reference!r} (its source is not available here)"


@dataclass
class ExerciseBook:
    """One notebook's exercises: each check prints its verdict; ``tally`` prints the separate exercise line."""

    notebook: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    planned: list[str] = field(default_factory=list)

    def check(self, exercise: Exercise, answer: Any, cases: Sequence[dict] | None = None) -> None:
        """Judge the learner's answer, print the verdict and record it (the latest check of an exercise wins)."""
        if exercise.key not in self.planned:
            self.planned.append(exercise.key)
        try:
            verdict = judge(exercise, answer, cases)
        except Exception as err:  # a defect of the check itself: say so in one line instead of a traceback
            verdict = Verdict(exercise.key, WRONG, f"[{exercise.key}] the check itself failed "
                                                   f"({type(err).__name__}: {err}); please report it")
        self.verdicts[exercise.key] = verdict
        print(verdict.text)

    def reveal(self, exercise: Exercise) -> None:
        """Print the reference solution (only when the learner asks)."""
        print(f"# reference for [{exercise.key}]: {exercise.task}\n{reference_source(exercise)}")

    def counts(self) -> tuple[int, int, int]:
        """(exercises checked in this notebook, attempted, correct)."""
        attempted = sum(v.status != NOT_ATTEMPTED for v in self.verdicts.values())
        correct = sum(v.status == CORRECT for v in self.verdicts.values())
        return len(self.planned), attempted, correct

    def tally(self) -> str:
        """Print 'exercises: A of N attempted, C correct'; append it to ``$LABKIT_LESSON_LOG`` as its own record."""
        total, attempted, correct = self.counts()
        line = f"{self.notebook}: exercises: {attempted} of {total} attempted, {correct} correct"
        print(line)
        append_to_lesson_log({"kind": "exercises", "notebook": self.notebook, "total": total,
                              "attempted": attempted, "correct": correct})
        return line


def summarize_exercise_log(path: str | Path) -> str:
    """Total the exercise records of one run (the last record of each notebook wins)."""
    by_notebook = last_record_per_notebook(path, "exercises")
    total = sum(r["total"] for r in by_notebook.values())
    attempted = sum(r["attempted"] for r in by_notebook.values())
    correct = sum(r["correct"] for r in by_notebook.values())
    return (f"exercises: {attempted} of {total} attempted, {correct} correct "
            f"in {len(by_notebook)} notebooks")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m labkit.core.exercises LESSON_LOG_FILE")
    try:
        print(summarize_exercise_log(sys.argv[1]))
    except LessonLogError as err:
        sys.exit(f"error: {err}")
