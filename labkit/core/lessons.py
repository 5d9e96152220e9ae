"""Lesson checks: every claim a notebook teaches is asserted on live numbers, and the reader sees the tally.

A notebook makes one ``LessonLog`` and routes each lesson's asserts through it. A lesson that fails raises
``AssertionError`` naming the claim (so nbval fails); a lesson that truly cannot run here (no MPI launcher,
one GPU where two are needed) prints a visible ``NOT CHECKED: <claim> (<reason>)`` line instead of passing in
silence; the last cell calls ``tally()``. When ``LABKIT_LESSON_LOG`` names a file, each tally is appended to
it as one JSON line, so ``python -m labkit.core.lessons FILE`` can total a whole nbval run. Torch-free.
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

LESSON_LOG_ENV_VAR = "LABKIT_LESSON_LOG"


@dataclass
class LessonLog:
    """The lessons one notebook checked, and the ones it could not check here (with why)."""

    notebook: str
    checked: list[str] = field(default_factory=list)
    not_checked_reasons: dict[str, str] = field(default_factory=dict)

    def check(self, claim: str, holds: bool, detail: str = "") -> None:
        """Assert one lesson claim on live numbers; ``detail`` says what was measured when it fails."""
        if not holds:
            raise AssertionError(f"lesson not shown on this run: {claim}" + (f" ({detail})" if detail else ""))
        self._record(claim)

    @contextmanager
    def lesson(self, claim: str) -> Iterator[None]:
        """Group several plain ``assert`` statements under one claim: ``with log.lesson("..."): assert ...``."""
        try:
            yield
        except AssertionError as err:
            raise AssertionError(f"lesson not shown on this run: {claim} ({err or 'assert failed'})") from None
        self._record(claim)

    def not_checked(self, claim: str, reason: str) -> None:
        """Say, visibly, that a lesson could not be checked on this machine and why."""
        if not reason.strip():
            raise ValueError("not_checked needs a reason the reader can act on")
        self.not_checked_reasons[claim] = reason
        print(f"NOT CHECKED: {claim} ({reason})")

    def not_checked_all(self, claims: Iterable[str], reason: str) -> None:
        """``not_checked`` for each claim of a section that cannot run here, so the tally counts every one."""
        for claim in claims:
            self.not_checked(claim, reason)

    def _record(self, claim: str) -> None:
        if claim not in self.checked:
            self.checked.append(claim)
        self.not_checked_reasons.pop(claim, None)

    @property
    def total(self) -> int:
        return len(self.checked) + len(self.not_checked_reasons)

    def tally(self) -> str:
        """Print and return 'N of M lessons checked'; append it to ``$LABKIT_LESSON_LOG`` when that is set."""
        line = f"{self.notebook}: {len(self.checked)} of {self.total} lessons checked"
        if self.not_checked_reasons:
            line += "; not checked: " + "; ".join(f"{c} ({r})" for c, r in self.not_checked_reasons.items())
        print(line)
        log_path = os.environ.get(LESSON_LOG_ENV_VAR)
        if log_path:
            record = {"notebook": self.notebook, "checked": self.checked, "not_checked": self.not_checked_reasons}
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return line


def summarize_lesson_log(path: str | Path) -> str:
    """Total the tallies one run wrote (the last tally of each notebook wins)."""
    by_notebook: dict[str, dict] = {}
    log = Path(path)
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                if record.get("kind") != "exercises":      # exercise tallies are totalled by core.exercises
                    by_notebook[record["notebook"]] = record
    checked = sum(len(r["checked"]) for r in by_notebook.values())
    total = checked + sum(len(r["not_checked"]) for r in by_notebook.values())
    lines = [f"lessons: {checked} of {total} checked in {len(by_notebook)} notebooks"]
    for name, record in sorted(by_notebook.items()):
        for claim, reason in record["not_checked"].items():
            lines.append(f"  NOT CHECKED in {name}: {claim} ({reason})")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m labkit.core.lessons LESSON_LOG_FILE")
    print(summarize_lesson_log(sys.argv[1]))
