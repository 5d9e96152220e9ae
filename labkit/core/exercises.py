"""Exercises that check themselves: the learner's code, run against the kit's reference, gets a verdict.

An :class:`Exercise` names a reference (the kit's own function, or a short one next to the lesson code it
exercises), the cases to run on (random sizes, world sizes, or the numbers the notebook just measured) and the
typical wrong answers (:class:`Mistake`), each with the hint aimed at it. :func:`judge` returns one of three
verdicts: not attempted yet (the stub is still ``...``), correct (with the numbers of the first case, and what a
live ``measure`` found), or wrong (with the hint of the mistake the answer matches, else the first case it got
wrong). :class:`ExerciseBook` is one notebook's tally, kept apart from the lesson tally, and ``reveal`` prints a
reference.

What the check guards against is an answer that goes wrong by accident, not one written to cheat: the reference
runs first, on its own deep copies of every case; the learner's function runs on other copies, in a guarded thread
under a time limit, its prints captured and capped, everything it raises (``SystemExit`` and ``KeyboardInterrupt``
included) reported as the learner's, and all of its own code (its signature, its value's conversion, its
exception's message, its ``__del__``) run there too (:mod:`labkit.core.guard`, which also says what no thread can
stop); types and shapes are checked before values, whole numbers compared exactly, floats to the exercise's
tolerance but never tighter than float32 rounding (:mod:`labkit.core.answers`); and besides the cases a learner is
shown, each check draws fresh cases with a new seed (when the exercise's ``cases`` takes ``seed``), so a table of
the shown answers fails. The answer runs in the kernel's own process, so code written to cheat can reach the
reference (through ``gc`` or the threads' frames) or replace this module's functions: the check is a tutor, not
an exam. In a ``measure`` step every call of the learner's function is guarded the same way and compared with the
reference on that call's input, so an error there is attributed to the learner, never to the kit.

Why not otter-grader or nbgrader: see the README's "Exercises" section. Torch-free.
"""
from __future__ import annotations

import copy
import inspect
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from labkit.core.answers import FLOAT32_REL_TOL, mismatch, only_plain, plain, show, show_args
from labkit.core.clock import Deadline
from labkit.core.guard import (AnswerProblem, Outcome, describe_output, describe_problem,  # noqa: F401
                               learner_error, run_guarded)
from labkit.core.lessons import LessonLogError, append_to_lesson_log, last_record_per_notebook

NOT_ATTEMPTED, CORRECT, WRONG = "not attempted yet", "correct", "wrong"
TIME_LIMIT_S = 5.0              # all calls of one check together; the exercises' answers take milliseconds


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer, written as code, and the hint a learner who made it should read."""

    name: str
    answer: Callable[..., Any]
    hint: str


@dataclass(frozen=True)
class Exercise:
    """One checked exercise: the task, the reference, the cases it is judged on and the typical mistakes.

    ``cases`` returns a list of keyword-argument dicts, seeded so the shown cases are reproducible; when it
    takes a ``seed`` argument, each check also judges on ``cases(seed=<fresh>)``, cases the learner has not been
    shown. ``measure`` (optional) runs after a correct answer and returns a line of live numbers for the verdict.
    ``rel_tol`` is the floats' relative tolerance; :func:`tolerance` never lets it be tighter than float32 rounding.
    """

    key: str
    task: str
    reference: Callable[..., Any]
    cases: Callable[[], list[dict]]
    mistakes: tuple[Mistake, ...]
    hint: str
    rel_tol: float = 1e-6
    measure: Callable[[Callable[..., Any]], str] | None = None
    time_limit_s: float = TIME_LIMIT_S

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


def _unfilled(answer: Any) -> bool:
    return answer is None or answer is Ellipsis


class _LearnerError(BaseException):
    """Carries a fault of the learner's code out of a comparison loop or a ``measure`` step (a BaseException, so
    kit code that catches ``Exception`` inside ``measure`` cannot swallow it)."""


def _bound(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind a check that it takes the case's argument names; both run in the guarded thread, since reading
    a signature may run the answer's own code (a ``__signature__`` property)."""
    def call(**case: Any) -> Any:
        try:
            inspect.signature(fn).bind(**case)
        except TypeError as err:
            raise AnswerProblem(f"your function cannot be called as f({', '.join(case)}): {err}; keep the stub's "
                                "argument names") from None
        except ValueError:  # no signature to read (a builtin): let the call itself say
            pass
        return fn(**case)
    return call


def _learners_value(value: Any) -> Any:
    """What the check keeps of an answer's value: plain data only (run in the guarded thread)."""
    return only_plain(plain(value))


def _call(fn: Callable[..., Any], case: dict, deadline: Deadline, printed: list[Outcome]) -> Any:
    """One guarded call of the learner's function on a private copy of ``case``; its fault raises _LearnerError."""
    outcome = run_guarded(_bound(fn), case, max(deadline.remaining_s, 1e-3), convert=_learners_value)
    printed.append(outcome)
    problem = describe_problem(outcome, deadline.timeout_s)
    if problem:
        raise _LearnerError(problem)
    return outcome.value


def tolerance(exercise: Exercise) -> float:
    """The relative tolerance floats are judged with: the exercise's, never tighter than float32 rounding."""
    return max(exercise.rel_tol, FLOAT32_REL_TOL)


def fresh_cases(exercise: Exercise, seed: int) -> list[dict]:
    """Cases drawn with a new seed, not shown to the learner; [] when the exercise's cases take no seed."""
    try:
        takes_seed = "seed" in inspect.signature(exercise.cases).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return list(exercise.cases(seed=seed)) if takes_seed else []


def _matching_mistake(exercise: Exercise, cases: list[dict], got: list[Any]) -> Mistake | None:
    for mistake in exercise.mistakes:
        try:
            theirs = [plain(mistake.answer(**copy.deepcopy(c))) for c in cases]
        except Exception:  # a typical mistake that cannot even run on some case is not the one made
            continue
        if all(mismatch(g, t, tolerance(exercise)) is None for g, t in zip(got, theirs)):
            return mistake
    return None


def _wrong(exercise: Exercise, shown: list[dict], hidden: list[dict], got: list[Any], want: list[Any],
           seed: int) -> Verdict:
    """The verdict for an answer that differs somewhere: the first shown case it gets wrong, else a fresh one."""
    cases = shown + hidden
    reasons = [mismatch(g, w, tolerance(exercise)) for g, w in zip(got, want)]
    bad = [i for i, r in enumerate(reasons) if r is not None]
    mistake = _matching_mistake(exercise, cases, got)
    hint = f"\n  hint: {mistake.hint if mistake else exercise.hint}"
    first, why = bad[0], (f" ({reasons[bad[0]]})" if reasons[bad[0]] else "")
    head = f"[{exercise.key}] wrong"
    if first < len(shown):
        text = (f"{head} on {len(bad)} of {len(cases)} cases; e.g. {show_args(cases[first])}: you gave "
                f"{show(got[first])}{why}, the kit's reference gives {show(want[first])}")
    else:
        text = (f"{head} on {len(bad)} of {len(hidden)} fresh cases (drawn for this check with seed {seed}, not "
                f"shown before), though right on all {len(shown)} shown ones; e.g. {show_args(cases[first])}: you "
                f"gave {show(got[first])}{why}. Compute the answer from the arguments: a table of shown answers "
                "fails on new inputs")
    return Verdict(exercise.key, WRONG, text + hint, mistake.name if mistake else None)


def _measured(exercise: Exercise, fn: Callable[..., Any], deadline: Deadline) -> Callable[..., Any]:
    """The learner's function as ``measure`` sees it: each call guarded and checked against the reference on that
    call's input, so anything that goes wrong there because of the answer is reported as the learner's."""
    def call(**kwargs: Any) -> Any:
        want = plain(exercise.reference(**copy.deepcopy(kwargs)))
        got = _call(fn, kwargs, deadline, [])
        reason = mismatch(got, want, tolerance(exercise))
        if reason is not None:
            raise _LearnerError(f"on the measured case {show_args(kwargs)} you gave {show(got)}"
                                f"{f' ({reason})' if reason else ''}, the kit's reference gives {show(want)}")
        return got
    return call


def judge(exercise: Exercise, answer: Any, cases: Sequence[dict] | None = None, *,
          time_limit_s: float | None = None, seed: int | None = None) -> Verdict:
    """Run ``answer`` (a function, or a value for a no-argument exercise) on the shown cases (``cases``, else the
    exercise's) and on fresh ones, and return the verdict; ``seed`` fixes the fresh cases (tests)."""
    head = f"[{exercise.key}]"
    if _unfilled(answer):
        return Verdict(exercise.key, NOT_ATTEMPTED, f"{head} not attempted yet: {exercise.task}")
    fn = answer if callable(answer) else (lambda **_: answer)
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    shown = list(cases) if cases is not None else list(exercise.cases())
    hidden = fresh_cases(exercise, seed) if any(shown) else []
    every = shown + hidden
    want = [plain(exercise.reference(**copy.deepcopy(c))) for c in every]   # before the learner's code runs
    deadline, outcomes = Deadline(time_limit_s or exercise.time_limit_s), []
    try:
        got = [_call(fn, c, deadline, outcomes) for c in every]
    except _LearnerError as err:
        return Verdict(exercise.key, WRONG, f"{head} wrong: {err}{describe_output(outcomes)}")
    if all(_unfilled(g) for g in got):
        return Verdict(exercise.key, NOT_ATTEMPTED, f"{head} not attempted yet (your function returns nothing): "
                                                    f"{exercise.task}")
    if any(mismatch(g, w, tolerance(exercise)) is not None for g, w in zip(got, want)):
        verdict = _wrong(exercise, shown, hidden, got, want, seed)
        return Verdict(verdict.key, WRONG, verdict.text + describe_output(outcomes), verdict.mistake)
    live = ""
    if exercise.measure is not None:
        try:
            live = "\n  measured: " + exercise.measure(_measured(exercise, fn, Deadline(deadline.timeout_s)))
        except _LearnerError as err:
            return Verdict(exercise.key, WRONG, f"{head} right on all {len(every)} cases, but wrong in the live "
                                                f"measurement: {err}")
    return Verdict(exercise.key, CORRECT, f"{head} correct on all {len(every)} cases{f' ({len(hidden)} of them fresh)' if hidden else ''}, "
                                          f"e.g. {show_args(shown[0])} -> {show(got[0])}{live}{describe_output(outcomes)}")

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
