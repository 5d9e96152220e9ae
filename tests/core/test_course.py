"""The course as data (issue 52): every notebook has an entry, the path reads each after its prerequisites and
teaches each term before a later notebook leans on it, the needs agree with what the notebooks run, and the reading
minutes are counted, not typed."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.core.course import (GLOSSARY, LEARNING_PATH, LESSONS, MPI, NAMESPACES, PARTS, TENSORFLOW, Lesson,
                                check_course, course_rows, find_cycle, glossary_markdown, measured_run_seconds,
                                needs_text, parts_markdown, path_markdown)
from labkit.core.prose import reading_minutes

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"


def _code(number: str) -> str:
    path = next(NOTEBOOKS.glob(f"{number}_*.ipynb"))
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_every_notebook_in_the_folder_has_an_entry_and_every_entry_a_notebook():
    rows = course_rows()
    assert sorted(r.file for r in rows) == sorted(p.name for p in NOTEBOOKS.glob("[0-9]*.ipynb"))
    assert [r.order for r in rows] == list(range(1, len(rows) + 1))
    assert {"02b", "05b", "06b", "09b", "13", "14", "15", "16", "17", "18"} <= set(LEARNING_PATH)


def test_a_notebook_without_an_entry_fails_naming_it(tmp_path):
    for path in NOTEBOOKS.glob("[0-9]*.ipynb"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "19_new_lesson.ipynb").write_text(json.dumps({"cells": [{"cell_type": "markdown",
                                                                         "source": ["# 19 · New"]}]}))
    with pytest.raises(ValueError, match=r"notebooks \['19'\] have no entry"):
        course_rows(tmp_path)
    (tmp_path / "19_new_lesson.ipynb").unlink()
    (tmp_path / "18_one_mesh.ipynb").unlink()
    with pytest.raises(ValueError, match=r"\['18'\] that are not in"):
        course_rows(tmp_path)


def test_reading_minutes_are_counted_from_the_prose_not_typed(tmp_path):
    rows = {r.lesson.number: r for r in course_rows()}
    assert all(r.reading_minutes == reading_minutes(NOTEBOOKS / r.file) > 0 for r in rows.values())
    for path in NOTEBOOKS.glob("[0-9]*.ipynb"):
        shutil.copy(path, tmp_path / path.name)
    nb = json.loads((tmp_path / rows["06"].file).read_text())
    nb["cells"].append({"cell_type": "markdown", "source": ["These are ten more words to read in this cell. " * 40]})
    (tmp_path / rows["06"].file).write_text(json.dumps(nb))
    longer = {r.lesson.number: r for r in course_rows(tmp_path)}["06"].reading_minutes
    assert longer == pytest.approx(rows["06"].reading_minutes + 400 / 200)       # 200 words a minute


def test_the_path_teaches_communication_and_data_parallelism_before_model_parallelism():
    place = {n: i for i, n in enumerate(LEARNING_PATH)}
    assert max(place["06"], place["07"]) < min(place["05"], place["05b"])
    assert place["12"] < min(place["13"], place["14"])


def test_the_capstone_comes_after_every_single_machine_notebook():
    """10 pulls together parts 1 to 3; only the notebooks that build emulated nodes (part 5) come after it."""
    place = {n: i for i, n in enumerate(LEARNING_PATH)}
    single_machine = [n for n, lesson in LESSONS.items() if lesson.part in PARTS[:3]]
    assert all(place[n] < place["10"] for n in single_machine)
    assert all(LESSONS[n].part == PARTS[4] for n in LEARNING_PATH[place["10"] + 1:])


def test_parts_are_read_in_order_one_after_another():
    parts = [LESSONS[n].part for n in LEARNING_PATH]
    assert parts == sorted(parts, key=PARTS.index) and set(parts) == set(PARTS)


def test_the_glossary_terms_are_taught_before_a_later_part_uses_them():
    place = {n: i for i, n in enumerate(LEARNING_PATH)}
    terms = {term.split(" (")[0] for term, _, _ in GLOSSARY}
    assert {"rank", "world size", "process group", "backend", "collective", "all-reduce", "data parallelism",
            "tensor parallelism", "pipeline parallelism", "context parallelism", "expert parallelism", "ZeRO / FSDP",
            "micro-batch", "MFU"} == terms
    for term, meaning, number in GLOSSARY:
        text = next(NOTEBOOKS.glob(f"{number}_*.ipynb")).read_text(encoding="utf-8").lower().replace("-", " ")
        words = [re.sub(r"ism$", "", w.strip(" ()").lower().replace("-", " ")) for w in re.split(r" / | \(|, ", term)]
        assert any(w in text for w in words), f"{number} never says {term!r}"
        assert "\n" not in meaning and len(meaning.split()) <= 16
    for term in ("rank", "world size", "all-reduce", "collective"):
        teacher = next(n for t, _, n in GLOSSARY if t == term)
        assert place[teacher] < place["05"], f"{term} is taught after model parallelism uses it"


def test_needs_agree_with_what_the_notebooks_run():
    """A notebook that builds emulated nodes needs namespaces; one that runs TensorFlow lessons needs TensorFlow; one
    that runs the MPI lane needs MPI. Read from the code cells, so a new section updates the test."""
    uses = {NAMESPACES: r"namespace_support|labkit\.cluster",
            TENSORFLOW: r"tensorflow_lessons_can_run|tensorflow_missing_reason",
            MPI: r"labkit\.comm\.mpi|labkit\.comm import mpi|mpi_nodes"}
    for need, pattern in uses.items():
        running = {n for n in LESSONS if re.search(pattern, _code(n))}
        listed = {n for n, lesson in LESSONS.items() if need in lesson.needs}
        assert running == listed, f"{need}: the code uses it in {sorted(running)}, the course lists {sorted(listed)}"
    assert needs_text(LESSONS["06"]) == "CPU only" and "MPI" in needs_text(LESSONS["06b"])


def test_a_missing_prerequisite_a_cycle_and_a_bad_path_are_one_line_errors():
    part = PARTS[0]
    a, b, c = Lesson("a", part, "a", "skill a"), Lesson("b", part, "b", "skill b", ("a",)), Lesson("c", part, "c", "c")
    check_course({"a": a, "b": b}, ("a", "b"))
    cases = [({"b": b}, ("b",), "b needs \\['a'\\]"),
             ({"a": Lesson("a", part, "a", "s", ("b",)), "b": b}, ("a", "b"), "circle .*: (a -> b -> a|b -> a -> b)"),
             ({"a": a, "b": b}, ("a",), "read every lesson once"),
             ({"a": a, "b": b, "c": c}, ("a", "b", "b"), "read every lesson once"),
             ({"a": a, "b": b}, ("b", "a"), "reads b before its prerequisites \\['a'\\]")]
    for lessons, path, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            check_course(lessons, path)
        assert "\n" not in str(err.value)


def test_find_cycle_names_the_circle_and_finds_none_in_the_course():
    assert find_cycle({"x": ("y",), "y": ("z",), "z": ("x",), "w": ()}) == ["x", "y", "z", "x"]
    assert find_cycle({"x": ("x",)}) == ["x", "x"]
    assert find_cycle({n: lesson.prerequisites for n, lesson in LESSONS.items()}) is None


def test_a_lesson_refuses_an_unknown_part_or_need_a_long_topic_and_itself_as_prerequisite():
    for kwargs in ({"part": "6 · beyond"}, {"needs": ("a TPU",)}, {"topic": "t" * 25}, {"prerequisites": ("z",)},
                   {"skill": "two\nlines"}):
        base = {"number": "z", "part": PARTS[0], "topic": "topic", "skill": "one skill"} | kwargs
        with pytest.raises(ValueError):
            Lesson(**base)


def test_the_tables_have_a_row_per_notebook_in_reading_order_and_link_each_one():
    rows = course_rows()
    table = path_markdown(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert [line.split("|")[1].strip() for line in table[2:]] == [str(r.order) for r in rows]
    assert all(f"({r.file})" in line and f"{r.reading_minutes:.0f} min" in line for r, line in zip(rows, table[2:]))
    parts = parts_markdown(rows).splitlines()
    assert [line.split("**")[1] for line in parts] == list(PARTS)
    glossary = glossary_markdown(rows).splitlines()
    assert len(glossary) == 2 + len(GLOSSARY) and "[06](06_all_reduce.ipynb)" in glossary[2]
    with pytest.raises(ValueError, match="glossary terms \\['x'\\]"):
        glossary_markdown(rows, (("x", "a term", "99"),))


def test_the_course_module_loads_no_framework():
    code = "import sys, labkit.core.course; assert not {'torch', 'tensorflow', 'matplotlib'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


def test_run_times_are_the_readme_budget_tables_measured_figures_not_typed(tmp_path):
    table = measured_run_seconds(REPO / "README.md")
    rows = course_rows()
    assert set(table) == {r.lesson.number for r in rows}              # every notebook's budget was measured
    assert all(r.run_seconds == table[r.lesson.number] > 0 for r in rows)
    assert all(f"| {r.run_seconds:.0f} s |" in line for r, line in zip(rows, path_markdown(rows).splitlines()[2:]))
    (tmp_path / "notebooks").mkdir()
    for path in NOTEBOOKS.glob("[0-9]*.ipynb"):
        shutil.copy(path, tmp_path / "notebooks" / path.name)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(readme.replace("| 31 s |", "| 77 s |", 1), encoding="utf-8")
    changed = {r.lesson.number: r.run_seconds for r in course_rows(tmp_path / "notebooks")}
    assert sorted(n for n in changed if changed[n] != table[n]) == [n for n in table if table[n] == 31][:1]
    (tmp_path / "README.md").unlink()                                 # an installed package has no README
    rows = course_rows(tmp_path / "notebooks")
    assert all(r.run_seconds is None for r in rows) and "| not measured |" in path_markdown(rows)
