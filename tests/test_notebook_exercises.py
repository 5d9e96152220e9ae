"""The notebooks' checked exercises as shipped (issue 25): every stub is unfilled and its check says 'not attempted
yet', every stub has the signature its reference is called with, and every exercise in labkit is in a notebook.

The other two CI checks (the reference passes, each typical mistake is caught with its hint) live in
tests/<package>/test_exercises.py; nbval runs the cells themselves."""
from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from labkit.core.exercises import NOT_ATTEMPTED, Exercise, judge
from tests.exercise_support import all_exercises

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
CHECK = re.compile(r"book\.check\(ex\.(\w+),\s*(\w+)")
MIN_PER_NOTEBOOK = {"00_start_here": 1}


def tagged(nb: dict, tag: str) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]


def exercises_of(path: Path) -> list[tuple[Exercise, str, str]]:
    """(exercise, stub source, the stub's function name) for each check cell of a notebook."""
    nb = json.loads(path.read_text())
    setup = tagged(nb, "exercise-setup")
    if not setup:
        return []
    module = importlib.import_module(re.search(r"from (labkit[\w.]*) import exercises as ex", setup[0]).group(1)
                                     + ".exercises")
    stubs = tagged(nb, "exercise-stub")
    checks = [CHECK.search(src).groups() for src in tagged(nb, "exercise-check")]
    assert len(stubs) == len(checks), f"{path.name}: every stub needs one check cell"
    return [(getattr(module, key), stub, name) for stub, (key, name) in zip(stubs, checks)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_shipped_stubs_are_not_attempted_and_match_their_reference(path):
    found = exercises_of(path)
    assert len(found) >= MIN_PER_NOTEBOOK.get(path.stem, 2), f"{path.name} has {len(found)} checked exercises"
    for exercise, stub, name in found:
        namespace: dict = {}
        exec(compile(stub, f"<{path.stem} stub>", "exec"), namespace)   # a stub cell is a bare def: no imports
        learner = namespace[name]
        assert judge(exercise, learner).status == NOT_ATTEMPTED, f"{path.name}: {exercise.key} stub is filled in"
        assert list(inspect.signature(learner).parameters) == list(inspect.signature(exercise.reference).parameters), \
            f"{path.name}: the stub {name} takes other arguments than the check passes"


def test_every_exercise_is_in_exactly_one_notebook_and_there_are_25_or_more():
    used = [exercise.key for path in NOTEBOOKS for exercise, _, _ in exercises_of(path)]
    defined = {exercise.key for exercise in all_exercises()}     # every *exercises module, sub-packages too
    assert len(used) == len(set(used)) and set(used) == defined
    assert len(used) >= 25


def test_the_readme_table_lists_each_notebooks_exercises():
    readme = (NOTEBOOKS[0].parents[1] / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        row = re.search(rf"^\| \w+ \| `{path.stem}` \|.*$", readme, flags=re.M)
        assert row, f"README has no row for {path.stem}"
        keys = [exercise.key for exercise, _, _ in exercises_of(path)]
        assert f"| {len(keys)}: " + ", ".join(f"`{k}`" for k in keys) + " |" in row.group(0), path.stem
