"""What every checked exercise must show (issue 25): its reference passes its own check, each typical wrong
answer is caught with that mistake's hint, and an unfilled stub reads 'not attempted yet'; and, for the exercises
judged on live ranks (issue 52), the notebook's stub and check cell, each mistake caught on the ranks and the one-line
verdicts: one copy of what every live-rank exercise's tests check (the ``own_tmp`` fixture is in conftest)."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
from pathlib import Path
from typing import Callable

import labkit

from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, Exercise, Verdict, judge

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


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


def notebook_rank_stub(notebook: str, exercise_name: str, model_answer: Callable, tmp_path: Path) -> Callable:
    """The notebook's one stub cell (tagged ``rank-exercise-stub``), loaded from a file so its source can be read,
    after checking that the one check cell (``rank-exercise-check``) hands it to ``ex.<exercise_name>.check`` and
    that it takes the model answer's arguments."""
    nb = json.loads((NOTEBOOKS / notebook).read_text(encoding="utf-8"))
    cells = {tag: ["".join(c["source"]) for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
             for tag in ("rank-exercise-stub", "rank-exercise-check")}
    assert len(cells["rank-exercise-stub"]) == len(cells["rank-exercise-check"]) == 1, {k: len(v) for k, v in
                                                                                         cells.items()}
    (tmp_path / "stub.py").write_text(cells["rank-exercise-stub"][0])
    spec = importlib.util.spec_from_file_location("notebook_stub", tmp_path / "stub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = re.search(rf"ex\.{exercise_name}\.check\(book,\s*(\w+)\)", cells["rank-exercise-check"][0])
    assert found, f"the check cell does not call ex.{exercise_name}.check(book, <stub>)"
    stub = getattr(module, found.group(1))
    assert list(inspect.signature(stub).parameters) == list(inspect.signature(model_answer).parameters)
    return stub


def assert_caught(verdict: Verdict, mistake) -> None:
    """A typical mistake judged on the ranks: wrong, named, and given its own hint."""
    assert verdict.status == WRONG and verdict.mistake == mistake.name and mistake.hint in verdict.text, verdict.text


def assert_one_line_each(said: dict[str, str], key: str) -> None:
    """Each hostile answer's verdict is one line that starts '[key] wrong'."""
    bad = {name: text for name, text in said.items()
           if len(text.splitlines()) != 1 or not text.startswith(f"[{key}] wrong")}
    assert not bad, bad


def assert_timed_out(verdict: Verdict, seconds: int) -> None:
    """A hanging answer met the launcher's timeout (``seconds``: start_s + case_s x cases) in one line."""
    assert verdict.status == WRONG and f"within {seconds} s, the launcher's timeout" in verdict.text, verdict.text
    assert len(verdict.text.splitlines()) == 1 and "every rank was killed" in verdict.text, verdict.text
