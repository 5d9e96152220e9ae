"""Lesson checks: every claim a notebook teaches is asserted on live numbers, and the reader sees the tally.

A notebook makes one ``LessonLog`` and routes each lesson's asserts through it. A lesson that fails raises
``AssertionError`` naming the claim (so nbval fails); a lesson that truly cannot run here (no MPI launcher,
one GPU where two are needed) prints a visible ``NOT CHECKED: <claim> (<reason>)`` line instead of passing in
silence; a timing claim the machine was too busy to settle (``labkit.core.verdict``) prints an equally visible
``INCONCLUSIVE: <claim> (<measured reason>)`` and is never counted as checked; the last cell calls
``tally()``. When ``LABKIT_LESSON_LOG`` names a file, each tally is appended to it as one JSON line, so
``python -m labkit.core.lessons FILE`` can total a whole nbval run. Torch-free.
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from labkit.core.results import WriteError, describe_os_error
from labkit.core.verdict import CHECKED, INCONCLUSIVE, INCONCLUSIVE_KINDS, NOT_CHECKED, Verdict

LESSON_LOG_ENV_VAR = "LABKIT_LESSON_LOG"


@dataclass
class LessonLog:
    """The lessons one notebook checked, and the ones it could not check here (with why)."""

    notebook: str
    checked: list[str] = field(default_factory=list)
    not_checked_reasons: dict[str, str] = field(default_factory=dict)
    inconclusive_reasons: dict[str, str] = field(default_factory=dict)
    inconclusive_kinds: dict[str, str] = field(default_factory=dict)    # claim -> load / spread / statistics
    rivals: dict[str, str] = field(default_factory=dict)                # checked claim -> the rival it ruled out
    no_rivals: dict[str, str] = field(default_factory=dict)             # checked claim -> why no rival applies

    def check(self, claim: str, holds: bool, detail: str = "", *, rival: str = "", no_rival: str = "") -> None:
        """Assert one lesson claim on live numbers; ``detail`` says what was measured (printed when it passes, in
        the error when it fails); ``rival``: the wrong answer the check rejected on this run (issue 51), or
        ``no_rival``: the one line saying why none applies (an exact equality with an independent computation)."""
        _one_of(rival, no_rival)
        if not holds:
            raise AssertionError(f"lesson not shown on this run: {claim}" + (f" ({detail})" if detail else ""))
        self._record(claim, detail, rival, no_rival)

    @contextmanager
    def lesson(self, claim: str, *, rival: str = "", no_rival: str = "") -> Iterator[None]:
        """Group several plain ``assert`` statements under one claim: ``with log.lesson("..."): assert ...``."""
        _one_of(rival, no_rival)
        try:
            yield
        except AssertionError as err:
            raise AssertionError(f"lesson not shown on this run: {claim} ({err or 'assert failed'})") from None
        self._record(claim, rival=rival, no_rival=no_rival)

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

    def judged_on_gpu(self, claim: str, on_gpu: bool, ran_on: str, measured: str) -> bool:
        """True where a GPU lesson can be judged; on any other device the claim is NOT CHECKED, saying where it ran
        and what it measured there (``if log.judged_on_gpu(...): log.decide(...)``): one rule for every notebook."""
        if not on_gpu:
            self.not_checked(claim, f"a GPU lesson and this ran on {ran_on}; {measured}")
        return on_gpu

    def inconclusive(self, claim: str, reason: str, kind: str = "") -> None:
        """Say, visibly, that this run could not settle a claim, with the measured reason and its ``kind``: the
        machine's load, the rounds' or seeds' spread, or statistics too weak to reject the rival."""
        if not reason.strip():
            raise ValueError("inconclusive needs the measured reason, e.g. 'rank 0 got 0.46 of a core'")
        if kind and kind not in INCONCLUSIVE_KINDS:
            raise ValueError(f"an INCONCLUSIVE kind is one of {INCONCLUSIVE_KINDS}, got {kind!r}")
        if claim in self.checked:
            self.checked.remove(claim)
        self.not_checked_reasons.pop(claim, None)
        self.rivals.pop(claim, None)
        self.no_rivals.pop(claim, None)
        self.inconclusive_reasons[claim] = reason
        self.inconclusive_kinds[claim] = kind
        print(f"INCONCLUSIVE ({kind or 'kind not said'}): {claim} ({reason})")

    def decide(self, verdict: Verdict, *, no_rival: str = "") -> Verdict:
        """Record a verdict: checked counts (and prints its figures and rival), INCONCLUSIVE and NOT CHECKED print
        their reasons, failed raises; ``no_rival`` says why a verdict without a rival needs none."""
        if verdict.state == INCONCLUSIVE:
            self.inconclusive(verdict.claim, verdict.detail, verdict.kind)
        elif verdict.state == NOT_CHECKED:
            self.not_checked(verdict.claim, verdict.detail)
        else:
            self.check(verdict.claim, verdict.state == CHECKED, verdict.detail, rival=verdict.rival,
                       no_rival="" if verdict.rival else no_rival)
        return verdict

    def _record(self, claim: str, detail: str = "", rival: str = "", no_rival: str = "") -> None:
        if claim not in self.checked:
            self.checked.append(claim)
            text = detail if isinstance(detail, str) else str(detail)     # notebooks pass numbers and tables too
            said = text if not rival or rival in text else f"{text}; rules out {rival}" if text else \
                f"rules out {rival}"
            print(f"\u2713 {claim}" + (f" ({said})" if said else ""))           # a passing check says what it showed
        if rival:
            self.rivals[claim] = rival
        if no_rival:
            self.no_rivals[claim] = no_rival
        self.not_checked_reasons.pop(claim, None)
        self.inconclusive_reasons.pop(claim, None)
        self.inconclusive_kinds.pop(claim, None)

    @property
    def total(self) -> int:
        return len(self.checked) + len(self.not_checked_reasons) + len(self.inconclusive_reasons)

    def tally(self) -> str:
        """Print and return 'N of M lessons checked (R rejected a named rival)', INCONCLUSIVE by kind; append it to
        ``$LABKIT_LESSON_LOG`` when that is set."""
        rivals = sum(c in self.rivals for c in self.checked)
        exact = sum(c in self.no_rivals and c not in self.rivals for c in self.checked)
        line = (f"{self.notebook}: {len(self.checked)} of {self.total} lessons checked "
                f"({rivals} rejected a named rival, {exact} need none)")
        if self.not_checked_reasons:
            line += "; not checked: " + "; ".join(f"{c} ({r})" for c, r in self.not_checked_reasons.items())
        if self.inconclusive_reasons:
            line += (f"\n{self.notebook}: {len(self.inconclusive_reasons)} INCONCLUSIVE "
                     f"({by_kind(self.inconclusive_kinds.values())}): "
                     + "; ".join(f"{c} ({r})" for c, r in self.inconclusive_reasons.items()))
        print(line)
        append_to_lesson_log({"notebook": self.notebook, "checked": self.checked,
                              "not_checked": self.not_checked_reasons,
                              "inconclusive": self.inconclusive_reasons,
                              "inconclusive_kinds": self.inconclusive_kinds, "rivals": self.rivals,
                              "no_rivals": self.no_rivals})
        return line


def _one_of(rival: str, no_rival: str) -> None:
    """A claim names its rival or says why none applies, not both."""
    if rival and no_rival:
        raise ValueError("a claim names its rival or says why none applies (no_rival), not both")


def by_kind(kinds: Iterable[str]) -> str:
    """'load 2, spread 1, statistics 0, kind not said 1': INCONCLUSIVE counted by kind, each on its own."""
    kinds = list(kinds)
    counts = [f"{k} {kinds.count(k)}" for k in INCONCLUSIVE_KINDS]
    unsaid = sum(1 for k in kinds if not k)
    return ", ".join(counts + ([f"kind not said {unsaid}"] if unsaid else []))


def append_to_lesson_log(record: dict) -> None:
    """One JSON line appended to ``$LABKIT_LESSON_LOG`` (nothing when it is unset): lesson and exercise tallies."""
    log_path = os.environ.get(LESSON_LOG_ENV_VAR)
    if log_path:
        append_line(Path(log_path), json.dumps(record) + "\n")


def append_line(path: Path, line: str) -> None:
    """Append ``line`` whole or not at all: a full disk cuts it back to the old end and raises one WriteError."""
    data = line.encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as err:
        raise WriteError(describe_os_error(path, err)) from None
    try:
        end = os.fstat(fd).st_size
        try:
            done = 0
            while done < len(data):         # a write that fits only part of the line returns short; go on
                done += os.write(fd, data[done:])
        except OSError as err:
            os.ftruncate(fd, end)           # no half line for the tally command to trip over
            raise WriteError(describe_os_error(path, err)) from None
    finally:
        os.close(fd)


class LessonLogError(ValueError):
    """The lesson log is missing, unreadable or not JSON lines; the message names the file and the line."""


def _read_json_lines(log: Path) -> list[tuple[int, dict]]:
    """(line number, record) for every line of ``log``; one LessonLogError naming the file otherwise."""
    try:
        text = log.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LessonLogError(f"{log} does not exist; run the notebooks with {LESSON_LOG_ENV_VAR}={log} first") from None
    except (OSError, UnicodeDecodeError) as err:
        raise LessonLogError(f"{log} cannot be read ({getattr(err, 'strerror', None) or err})") from None
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise LessonLogError(f"{log} line {number} is not a lesson tally ({type(err).__name__}: {err}); "
                                 "it may be cut short: rerun the notebooks to write it again") from None
        if not isinstance(record, dict):
            raise LessonLogError(f"{log} line {number} is not a lesson tally (a JSON {type(record).__name__}); "
                                 "rerun the notebooks to write it again")
        records.append((number, record))
    return records


def last_record_per_notebook(path: str | Path, kind: str | None) -> dict[str, dict]:
    """The last record of each notebook in a lesson log whose ``kind`` is ``kind`` (None: lesson tallies)."""
    log = Path(path)
    by_notebook: dict[str, dict] = {}
    for number, record in _read_json_lines(log):
        if record.get("kind") != kind:
            continue
        if kind is None:
            try:
                record = {"notebook": str(record["notebook"]), "checked": list(record["checked"]),
                          "not_checked": dict(record["not_checked"]),
                          "inconclusive": dict(record.get("inconclusive") or {}),
                          "inconclusive_kinds": dict(record.get("inconclusive_kinds") or {}),
                          "rivals": dict(record.get("rivals") or {}),
                          "no_rivals": dict(record.get("no_rivals") or {})}
            except (KeyError, TypeError, ValueError) as err:
                raise LessonLogError(f"{log} line {number} is not a lesson tally ({type(err).__name__}: {err}); "
                                     "it may be cut short: rerun the notebooks to write it again") from None
        by_notebook[str(record.get("notebook"))] = record
    return by_notebook


def summarize_lesson_log(path: str | Path) -> str:
    """Total the tallies one run wrote (the last tally of each notebook wins); LessonLogError if it cannot."""
    by_notebook = last_record_per_notebook(path, None)      # exercise tallies are totalled by core.exercises
    if not by_notebook:
        raise LessonLogError(f"{path} holds no lesson tally; run the notebooks with {LESSON_LOG_ENV_VAR}={path} "
                             "first")
    checked = sum(len(r["checked"]) for r in by_notebook.values())
    inconclusive = sum(len(r.get("inconclusive", {})) for r in by_notebook.values())
    total = checked + inconclusive + sum(len(r["not_checked"]) for r in by_notebook.values())
    rivals = sum(sum(c in r["rivals"] for c in r["checked"]) for r in by_notebook.values())
    exact = sum(sum(c in r["no_rivals"] and c not in r["rivals"] for c in r["checked"]) for r in by_notebook.values())
    kinds = [r["inconclusive_kinds"].get(c, "") for r in by_notebook.values() for c in r["inconclusive"]]
    lines = [f"lessons: {checked} of {total} checked in {len(by_notebook)} notebooks; {rivals} of the {checked} "
             f"rejected a named rival, {exact} need none (said why), {checked - rivals - exact} say neither",
             f"INCONCLUSIVE: {inconclusive} ({by_kind(kinds)})"]
    for name, record in sorted(by_notebook.items()):
        for claim, reason in record["not_checked"].items():
            lines.append(f"  NOT CHECKED in {name}: {claim} ({reason})")
        for claim, reason in record.get("inconclusive", {}).items():
            lines.append(f"  INCONCLUSIVE in {name}: {claim} ({reason})")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m labkit.core.lessons FILE``: print the total; exit 1 with one line when the log is unusable."""
    if len(argv) != 1:
        print("usage: python -m labkit.core.lessons LESSON_LOG_FILE", file=sys.stderr)
        return 2
    try:
        print(summarize_lesson_log(argv[0]))
    except LessonLogError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
