"""Every open question of every notebook has its answer in docs/answer_key.md, and the key answers nothing else."""
import json
import shutil
from pathlib import Path

from labkit.core.open_questions import (KeyAnswer, OpenQuestion, answer_key, key_gaps, notebook_questions,
                                        open_questions, questions_in_cell)

REPO = Path(__file__).resolve().parents[2]
KEY = REPO / "docs" / "answer_key.md"

CELL = """**Takeaway:** text.

## Exercises
1. Set the delay to 0.001 s. Does it starve?
   Where is the break-even point?
2. Try `num_workers=1`
(an unindented continuation).

A paragraph after the list is not a question.
3. Nor is a numbered line after it.

## Checked exercises
1. A checked exercise is not an open question.
"""


def test_the_reader_takes_numbered_items_under_exercises_only():
    assert questions_in_cell(CELL) == [(1, "Set the delay to 0.001 s. Does it starve? Where is the break-even point?"),
                                       (2, "Try `num_workers=1` (an unindented continuation).")]
    assert questions_in_cell("## Exercises (checked)\n1. stub\n") == []
    assert questions_in_cell("## Exercises\n\n1. after a blank line\n2. two\n") == [(1, "after a blank line"),
                                                                                     (2, "two")]


def test_the_shipped_notebooks_ask_numbered_questions():
    questions = open_questions(REPO / "notebooks")
    assert len(questions) >= 60 and len({q.notebook for q in questions}) >= 15
    for name in {q.notebook for q in questions}:
        numbers = [q.number for q in questions if q.notebook == name]
        assert numbers == list(range(1, len(numbers) + 1)), name
    assert all(len(q.text) > 20 and "stub" not in q.text for q in questions)


def test_every_open_question_has_an_answer_in_the_key_and_the_key_answers_nothing_else():
    gaps = key_gaps(open_questions(REPO / "notebooks"), answer_key(KEY))
    assert gaps == [], "\n".join(gaps)


def test_the_key_heads_each_section_with_a_notebook_that_exists():
    files = {p.name for p in (REPO / "notebooks").glob("[0-9]*.ipynb")}
    assert {a.notebook for a in answer_key(KEY)} <= files


def _add_question(path: Path, text: str) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and any(
        line.startswith("## Exercises\n") for line in c["source"]))
    at = max(i for i, line in enumerate(cell["source"]) if line[:1].isdigit() and ". " in line)
    cell["source"].insert(at + 1, text + "\n")
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def test_a_question_added_without_an_answer_fails_and_a_removed_one_leaves_an_orphan(tmp_path):
    folder = tmp_path / "notebooks"
    shutil.copytree(REPO / "notebooks", folder)
    before = {q.number for q in notebook_questions(folder / "00_start_here.ipynb")}
    _add_question(folder / "00_start_here.ipynb", f"{max(before) + 1}. A new question with no answer yet?")
    gaps = key_gaps(open_questions(folder), answer_key(KEY))
    assert gaps == [f"00_start_here.ipynb #{max(before) + 1}: no answer in the key"]
    (folder / "00_start_here.ipynb").unlink()
    orphans = key_gaps(open_questions(folder), answer_key(KEY))
    assert orphans and all("does not ask" in g and g.startswith("00_start_here") for g in orphans)


def test_a_reworded_question_a_repeated_or_an_empty_answer_is_named():
    asked = [OpenQuestion("x.ipynb", 1, "Set the delay to 0.001 s.")]
    assert key_gaps(asked, [KeyAnswer("x.ipynb", 1, "Set the delay…", "It falls.")]) == []
    assert "not how the question opens" in key_gaps(asked, [KeyAnswer("x.ipynb", 1, "Set the batch…", "a")])[0]
    twice = key_gaps(asked, [KeyAnswer("x.ipynb", 1, "Set the", "a"), KeyAnswer("x.ipynb", 1, "Set the", "b")])
    assert twice == ["x.ipynb #1: answered twice"]
    assert key_gaps(asked, [KeyAnswer("x.ipynb", 1, "Set", " ")]) == ["x.ipynb #1: the answer is empty"]


def test_the_key_file_reader_joins_continuation_lines_and_ignores_other_sections(tmp_path):
    key = tmp_path / "key.md"
    key.write_text('# Key\n1. "not in a notebook section" ignored\n## a.ipynb\n1. "Set the…" It falls,\n'
                   '   because of X.\n## Notes\n2. "Other" ignored\n', encoding="utf-8")
    assert answer_key(key) == [KeyAnswer("a.ipynb", 1, "Set the…", "It falls, because of X.")]
