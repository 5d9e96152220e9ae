"""The notebooks' open questions and their answer key, read: every numbered item under a markdown heading that is
exactly ``Exercises`` is an open question (the "Checked exercises", judged by :mod:`labkit.core.exercises`, are not),
and ``docs/answer_key.md`` answers each under a heading naming its notebook's file. Torch-free.

The key's answers read ``N. "first words of the question…" the answer``: the quote ties an answer to its question,
so a reworded or renumbered question shows up as a mismatch instead of a wrong answer.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

_HEADING = re.compile(r"^#{1,6}\s")
_OPEN_HEADING = re.compile(r"^#{1,6}\s+Exercises\s*$")
_ITEM = re.compile(r"^(\d+)\.\s+(.*)$")
_KEY_SECTION = re.compile(r"^##\s+(\S+\.ipynb)\s*$")
_KEY_ANSWER = re.compile(r'^(\d+)\.\s+"([^"]+)"\s*(.*)$')


@dataclass(frozen=True)
class OpenQuestion:
    """One open question: the notebook's file name, its number in the notebook's list and its text (one line)."""

    notebook: str
    number: int
    text: str


@dataclass(frozen=True)
class KeyAnswer:
    """One answer of the key: the notebook it belongs to, the question's number, the quoted opening and the answer."""

    notebook: str
    number: int
    quote: str
    text: str


def _one_line(text: str) -> str:
    return " ".join(text.split())


def questions_in_cell(source: str) -> list[tuple[int, str]]:
    """(number, text) of each numbered item under an ``Exercises`` heading in one markdown cell's source; an item's
    continuation lines join it, and the list ends at the next heading or at text after a blank line."""
    items: list[list] = []
    inside, blank = False, False
    for line in source.splitlines():
        if _HEADING.match(line):
            inside, blank = bool(_OPEN_HEADING.match(line)), False
            continue
        if not inside:
            continue
        if not line.strip():
            blank = True
            continue
        item = _ITEM.match(line)
        if item:
            items.append([int(item.group(1)), item.group(2)])
        elif items and not blank:
            items[-1][1] += " " + line.strip()
        elif items:
            inside = False
        blank = False
    return [(number, _one_line(text)) for number, text in items]


def notebook_questions(path: str | Path) -> list[OpenQuestion]:
    """Every open question of one notebook, in the order it asks them."""
    path = Path(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            source = "".join(cell.get("source", ""))
            found += [OpenQuestion(path.name, n, text) for n, text in questions_in_cell(source)]
    return found


def open_questions(folder: str | Path) -> list[OpenQuestion]:
    """Every open question of every numbered notebook in ``folder``, in file-name order."""
    return [q for path in sorted(Path(folder).glob("[0-9]*.ipynb")) for q in notebook_questions(path)]


def answer_key(path: str | Path) -> list[KeyAnswer]:
    """The answers of a key file: numbered ``N. "quote" answer`` items under ``## <notebook>.ipynb`` headings;
    an answer's continuation lines join it."""
    answers: list[KeyAnswer] = []
    notebook = ""
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        section = _KEY_SECTION.match(line)
        if section or _HEADING.match(line):
            notebook = section.group(1) if section else ""
            continue
        answer = _KEY_ANSWER.match(line)
        if notebook and answer:
            answers.append(KeyAnswer(notebook, int(answer.group(1)), answer.group(2), answer.group(3)))
        elif notebook and answers and answers[-1].notebook == notebook and line.startswith(" ") and line.strip():
            last = answers.pop()
            answers.append(KeyAnswer(last.notebook, last.number, last.quote, f"{last.text} {line.strip()}"))
    return answers


def _matches(quote: str, question: str) -> bool:
    opening = _one_line(quote).rstrip("…").rstrip(".").strip()
    return bool(opening) and _one_line(question).startswith(opening)


def key_gaps(questions: list[OpenQuestion], answers: list[KeyAnswer]) -> list[str]:
    """What is wrong between the questions and the key, one line each: a question with no answer, an answer to no
    question, an answer whose quote is not its question's opening, an empty or repeated answer."""
    asked = {(q.notebook, q.number): q for q in questions}
    gaps, seen = [], set()
    for a in answers:
        where = f"{a.notebook} #{a.number}"
        if (a.notebook, a.number) in seen:
            gaps.append(f"{where}: answered twice")
        seen.add((a.notebook, a.number))
        if (a.notebook, a.number) not in asked:
            gaps.append(f"{where}: the key answers a question the notebook does not ask")
        elif not _matches(a.quote, asked[a.notebook, a.number].text):
            gaps.append(f'{where}: the quote "{a.quote}" is not how the question opens')
        if not a.text.strip():
            gaps.append(f"{where}: the answer is empty")
    gaps += [f"{q.notebook} #{q.number}: no answer in the key" for q in questions if (q.notebook, q.number) not in seen]
    return gaps
