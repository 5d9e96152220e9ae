"""What every checked exercise must show (issue 25): its reference passes its own check, each typical wrong
answer is caught with that mistake's hint, and an unfilled stub reads 'not attempted yet'."""
from __future__ import annotations

import importlib
import pkgutil

import labkit

from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, Exercise, judge


def assert_sound(exercise: Exercise) -> None:
    """Fail with the exercise's key when any of the three properties does not hold."""
    assert judge(exercise, exercise.reference).status == CORRECT, judge(exercise, exercise.reference).text
    for mistake in exercise.mistakes:
        verdict = judge(exercise, mistake.answer)
        assert verdict.status == WRONG, f"{exercise.key}: mistake {mistake.name} passes the check"
        assert verdict.mistake == mistake.name, f"{exercise.key}: {mistake.name} got another hint: {verdict.text}"
        assert mistake.hint in verdict.text

    def stub(**kwargs):
        ...

    assert judge(exercise, stub).status == NOT_ATTEMPTED
    assert judge(exercise, ...).status == NOT_ATTEMPTED


def _exercise_modules(package) -> list[str]:
    """Names of every ``*exercises`` module under ``package``, in sub-packages too (``labkit.parallel.tensor``)."""
    names = []
    for info in pkgutil.iter_modules(package.__path__):
        full = f"{package.__name__}.{info.name}"
        if info.ispkg:
            names += _exercise_modules(importlib.import_module(full))
        elif info.name.endswith("exercises"):
            names.append(full)
    return names


def all_exercises() -> list[Exercise]:
    """Every Exercise defined in any ``labkit.<package>[.<sub>].*exercises`` module (``exercises``,
    ``tp_exercises``, ``parallel/tensor/exercises``, ...), found by walking the packages, so an exercise a new
    notebook adds is covered without editing a list."""
    found: dict[str, Exercise] = {}
    for info in pkgutil.iter_modules(labkit.__path__):
        if not info.ispkg or info.name == "core":
            continue
        for name in _exercise_modules(importlib.import_module(f"labkit.{info.name}")):
            for value in vars(importlib.import_module(name)).values():
                if isinstance(value, Exercise):
                    found[value.key] = value
    return [found[k] for k in sorted(found)]
