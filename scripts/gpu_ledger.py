"""The GPU evidence ledger: one row per notebook, GPU test file and benchmark, kept in docs/gpu-report.md.

GPU time comes in short slots (about 10 minutes), and the whole kit does not fit in one. So each slot runs the
steps whose evidence is missing, stale or oldest, as many as fit its deadline, and merges its rows into the ledger;
over a few slots every step gets a row on the current code. Torch-free and git-only, so it is tested on a CPU.

Rules (the report repeats them):
- A row is **stale** (older than the code it checked) when, for the step's file or a ``labkit`` module it imports
  directly, the last commit touching it (``git log -1 --format=%H -- <path>``) is not an ancestor of the row's
  commit (``git merge-base --is-ancestor``), or when the row's commit is not in this history. ``import labkit``
  counts ``labkit/__init__.py``; a subpackage counts its whole folder. Outside git nothing is called stale.
- **Merging** keeps the newest row per step (a later date wins; a tie goes to the new row); a step that never
  started gives no row, so it never hides older evidence.
- A slot **chooses** steps missing first, then stale or unfinished, then the oldest, each planned at its recorded
  wall time (an unfinished one at 1.5 times what it ran before it was stopped), skipping any that no longer fits.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

NEVER = "never run on a GPU"
NOT_FINISHED = "not finished"
FULL_MODE_BUDGET_S = 180.0      # issue 58: every notebook's full mode under 3 minutes on an H100-class GPU
DEFAULT_COST_S = {"notebook": 60.0, "test": 10.0, "benchmark": 45.0}    # planning guesses for a step never timed
# Test files that reach a GPU: the instruments and the step, then the files whose lessons time work on a GPU.
GPU_TEST_FILES = ("tests/training/test_gpu_instruments.py", "tests/core/test_step.py",
                  "tests/training/test_run_memory.py", "tests/training/test_sampling.py", "tests/core/test_device.py",
                  "tests/cli/test_bench.py", "tests/cli/test_profile.py", "tests/core/test_gpu_neighbours.py",
                  "tests/core/test_verdict.py", "tests/training/test_loop.py", "tests/training/test_window.py")
START, END = "<!-- ledger:start -->", "<!-- ledger:end -->"
NOTES_START, NOTES_END = "<!-- notes:start -->", "<!-- notes:end -->"
SLOT_START, SLOT_END = "<!-- slot:start -->", "<!-- slot:end -->"
COLUMNS = ("step", "kind", "device", "commit", "date", "result", "wall (s)", "figures")


@dataclass(frozen=True)
class LedgerRow:
    """The newest evidence for one step: where and on which commit it ran, when, what came out."""

    step: str                      # the file: notebooks/10_tuning_ladder.ipynb, tests/core/test_step.py, ...
    kind: str                      # notebook, test or benchmark
    device: str = ""
    commit: str = ""
    date: str = ""                 # ISO, UTC: 2026-11-27 or 2026-11-27 06:50
    result: str = NEVER
    wall_s: float | None = None
    figures: str = ""

    @property
    def ran(self) -> bool:
        """Whether this row is evidence from a GPU (not the placeholder of a step never run)."""
        return self.result != NEVER

    @property
    def finished(self) -> bool:
        """Whether the step ran to its end (a row stopped mid-run holds only a lower bound on its time)."""
        return self.ran and not self.result.startswith(NOT_FINISHED)


KINDS = ("notebook", "test", "benchmark")


def kind_of(step: str) -> str:
    """notebook, test or benchmark, from the step's path."""
    return "notebook" if step.endswith(".ipynb") else ("test" if step.startswith("tests/") else "benchmark")


def all_steps(repo: Path) -> list[str]:
    """Every step the ledger holds: each numbered notebook in the folder now, each GPU test file, each benchmark."""
    notebooks = sorted(p.relative_to(repo).as_posix() for p in (repo / "notebooks").glob("[0-9]*.ipynb"))
    benchmarks = sorted(p.relative_to(repo).as_posix() for p in (repo / "benchmarks").glob("*.py"))
    return notebooks + [t for t in GPU_TEST_FILES if (repo / t).is_file()] + benchmarks


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ").strip()


def render_table(rows: list[LedgerRow]) -> list[str]:
    """The ledger as a Markdown table between its markers (what :func:`parse_ledger` reads back)."""
    lines = [START, "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        wall = "" if r.wall_s is None else f"{r.wall_s:.0f}"
        cells = (f"`{r.step}`", r.kind, r.device, r.commit[:10], r.date, r.result, wall, r.figures)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines + [END]


def parse_ledger(text: str) -> list[LedgerRow]:
    """The rows of a ledger table written by :func:`render_table`; [] where the text holds none."""
    if START not in text or END not in text:
        return []
    body = text.split(START, 1)[1].split(END, 1)[0].strip().splitlines()[2:]
    rows = []
    for line in body:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != len(COLUMNS):
            raise ValueError(f"a ledger row needs {len(COLUMNS)} cells, got {len(cells)}: {line}")
        step, kind, device, commit, date, result, wall, figures = cells
        rows.append(LedgerRow(step.strip("`"), kind, device, commit, date, result,
                              float(wall) if wall else None, figures))
    return rows


def merge_rows(old: list[LedgerRow], new: list[LedgerRow]) -> list[LedgerRow]:
    """Newest row per step (a later date wins, a tie goes to ``new``); placeholders never replace evidence."""
    best: dict[str, LedgerRow] = {}
    for row in [*old, *new]:
        held = best.get(row.step)
        if held is None or (row.ran and (not held.ran or row.date >= held.date)):
            best[row.step] = row
    return list(best.values())


def complete(rows: list[LedgerRow], steps: list[str]) -> list[LedgerRow]:
    """One row per step in ``steps`` order (a placeholder for a step with none), then the evidence rows of steps
    now gone (a gone step's placeholder is dropped)."""
    by_step = {r.step: r for r in rows}
    out = [by_step.pop(s, LedgerRow(s, kind_of(s))) for s in steps]
    return out + sorted((r for r in by_step.values() if r.ran), key=lambda r: r.step)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """git in ``repo``; a failed call (exit 127) where git itself is missing, as on some lent boxes."""
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(args, 127, "", str(err))


def _module_path(repo: Path, dotted: str) -> str | None:
    """labkit/a/b.py or the package folder labkit/a/b/ for ``labkit.a.b`` (``labkit`` alone: its __init__.py, not
    the whole kit); None where neither exists."""
    if dotted == "labkit":
        return "labkit/__init__.py"
    base = repo / Path(*dotted.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py").relative_to(repo).as_posix()
    return base.relative_to(repo).as_posix() + "/" if (base / "__init__.py").is_file() else None


def _sources(path: Path) -> list[str]:
    if path.suffix != ".ipynb":
        return [path.read_text()]
    cells = json.loads(path.read_text()).get("cells", [])
    code = ["".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code"]
    return ["\n".join(ln for ln in c.splitlines() if not ln.lstrip().startswith(("%", "!"))) for c in code]


def imported_modules(repo: Path, step: str) -> list[str]:
    """The labkit modules a notebook, test file or benchmark imports directly (files or package folders)."""
    found: set[str] = set()
    for source in _sources(repo / step):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "labkit"]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "labkit":
                names = [f"{node.module}.{a.name}" for a in node.names]
                names = [n if _module_path(repo, n) else node.module for n in names]   # a name, not a module
            else:
                continue
            found.update(p for p in (_module_path(repo, n) for n in names) if p)
    return sorted(found)


def last_change(repo: Path, paths: list[str]) -> str | None:
    """The newest commit touching any of ``paths`` (``git log -1 --format=%H -- paths``); None outside git."""
    out = _git(repo, "log", "-1", "--format=%H", "--", *paths)
    return out.stdout.strip() or None if out.returncode == 0 else None


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    """Whether commit ``older`` is in ``newer``'s history (``git merge-base --is-ancestor``)."""
    return _git(repo, "merge-base", "--is-ancestor", older, newer).returncode == 0


def staleness(repo: Path, row: LedgerRow, paths: list[str], changes: dict[str, str | None] | None = None) -> str | None:
    """Why ``row`` is older than the code it checked, or None where it is current (or never ran: missing, not stale).
    ``changes``: each path's last commit, filled as it goes (a cache shared across rows)."""
    if not row.ran:
        return None
    changes = {} if changes is None else changes
    for p in paths:
        if p not in changes:
            changes[p] = last_change(repo, [p])
    known = [p for p in paths if changes[p]]
    if not known:
        return None                                    # outside git (a lent box's copy of the tree): cannot tell
    if not row.commit or _git(repo, "cat-file", "-e", f"{row.commit}^{{commit}}").returncode != 0:
        return f"its commit `{row.commit or '?'}` is not in this history"
    changed = [p for p in known if not is_ancestor(repo, changes[p], row.commit)]
    if not changed:
        return None
    return f"changed since `{row.commit[:10]}`: " + ", ".join(f"`{p}`" for p in changed[:4]) + \
        (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


def stale_reasons(repo: Path, rows: list[LedgerRow]) -> dict[str, str]:
    """Step -> why its row is older than the code it checked, for every such row."""
    out: dict[str, str] = {}
    changes: dict[str, str | None] = {}
    for row in rows:
        if row.ran and (repo / row.step).is_file():
            why = staleness(repo, row, [row.step, *imported_modules(repo, row.step)], changes)
            if why:
                out[row.step] = why
    return out


def planned_cost_s(row: LedgerRow, default: dict[str, float] | None = None) -> float:
    """Seconds to plan for a step: its recorded wall time; 1.5x that where it was stopped; else a guess by kind."""
    if row.wall_s is not None and row.ran:
        return row.wall_s * (1.0 if row.finished else 1.5)
    return (default or DEFAULT_COST_S).get(row.kind, 60.0)


@dataclass(frozen=True)
class Choice:
    """One step considered for a slot: why (missing, stale, unfinished, oldest), its planned seconds, chosen or not."""

    step: str
    why: str
    cost_s: float
    chosen: bool
    note: str = ""


def choose_steps(rows: list[LedgerRow], stale: dict[str, str], deadline_s: float,
                 only: tuple[str, ...] = ()) -> list[Choice]:
    """Steps in priority order (missing, stale or unfinished, then oldest first), as many as fit ``deadline_s``."""
    def rank(row: LedgerRow) -> tuple:
        why = 0 if not row.ran else (1 if row.step in stale or not row.finished else 2)
        return why, row.date, KINDS.index(row.kind) if row.kind in KINDS else 3, row.step

    left, out = deadline_s, []
    for row in sorted((r for r in rows if not only or r.step in only), key=rank):
        why = ("missing" if not row.ran else "stale" if row.step in stale else
               NOT_FINISHED if not row.finished else f"oldest ({row.date})")
        cost = planned_cost_s(row)
        fits = cost <= left
        left -= cost if fits else 0.0
        out.append(Choice(row.step, why, cost, fits, "" if fits else f"needs {cost:.0f} s, {left:.0f} s left"))
    return out


def plan_lines(choices: list[Choice], deadline_s: float) -> list[str]:
    """The plan as text: each chosen step with its budget, the total against the deadline, what waits."""
    chosen = [c for c in choices if c.chosen]
    total = sum(c.cost_s for c in chosen)
    lines = [f"Plan: {len(chosen)} step(s), {total:.0f} s planned against a deadline of {deadline_s:.0f} s "
             f"({len(choices) - len(chosen)} wait for a later slot).", "",
             "| # | step | why | budget (s) |", "|---|---|---|---|"]
    lines += [f"| {i} | `{c.step}` | {c.why} | {c.cost_s:.0f} |" for i, c in enumerate(chosen, 1)]
    waiting = [c for c in choices if not c.chosen]
    if waiting:
        lines += ["", "Waiting: " + "; ".join(f"`{c.step}` ({c.why}{', ' + c.note if c.note else ''})"
                                             for c in waiting[:12]) + (" ..." if len(waiting) > 12 else "") + "."]
    return lines


RANKS = re.compile(r"\blaunch\(|torchrun|\bworld_sizes?\s*=(?!=)")     # a call on the page that starts ranks


def multi_rank(repo: Path, step: str) -> bool:
    """Whether a notebook's page starts ranks (``launch(``, torchrun, a world size given): gloo on a one-GPU box."""
    return any(RANKS.search(s) for s in _sources(repo / step))


def budget_lines(repo: Path, rows: list[LedgerRow]) -> list[str]:
    """Each notebook's full-mode wall time against the 3-minute budget, flagged where it exceeds it."""
    lines = [f"| notebook | recorded full mode (s) | on | budget (s) | within | ranks started on the page |", "|---|---|---|---|---|---|"]
    for r in (r for r in rows if r.kind == "notebook" and (repo / r.step).is_file()):
        if r.wall_s is None or not r.ran:
            wall, verdict = "not recorded", f"unknown (planned at {planned_cost_s(r):.0f} s)"
        else:
            wall = f"{r.wall_s:.0f}" if r.finished else f">= {r.wall_s:.0f} (stopped)"
            verdict = "yes" if r.finished and r.wall_s <= FULL_MODE_BUDGET_S else "**OVER BUDGET**"
        ranks = "yes: gloo CPU processes on one GPU" if multi_rank(repo, r.step) else "none named"
        lines.append(f"| `{r.step}` | {wall} | {r.device or '-'} | {FULL_MODE_BUDGET_S:.0f} | {verdict} | {ranks} |")
    return lines


def read_notes(text: str, start: str = NOTES_START, end: str = NOTES_END) -> str:
    """A marked section kept between renders: the hand-written notes (default) or the last slot's lines."""
    if start not in text:
        return ""
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def rerender(repo: Path, ledger: Path, deadline_s: float, as_of: str = "") -> str:
    """The ledger file rendered again from its own rows, notes and last slot (a new notebook gets its row)."""
    text = ledger.read_text() if ledger.is_file() else ""
    slot = read_notes(text, SLOT_START, SLOT_END)
    return render_ledger_report(repo, parse_ledger(text), deadline_s, slot=slot.splitlines() if slot else None,
                                notes=read_notes(text), as_of=as_of)


def render_ledger_report(repo: Path, rows: list[LedgerRow], deadline_s: float, *, slot: list[str] | None = None,
                         notes: str = "", as_of: str = "") -> str:
    """docs/gpu-report.md: the rules, the ledger, what is stale or never ran, the 3-minute budget, the next plan."""
    rows = complete(rows, all_steps(repo))
    stale = stale_reasons(repo, rows)
    never = [r.step for r in rows if not r.ran]
    lines = ["# GPU evidence ledger", "",
             "One row per notebook, GPU test file and benchmark: the newest evidence from a GPU, with the device, the "
             "commit it ran on, the date (UTC), its result and its figures. `make gpu-check` on a lent GPU runs the "
             "steps whose evidence is missing, stale or oldest, as many as fit its deadline, and merges its rows here; "
             "`scripts/gpu_check.py --plan` prints the next slot's choice anywhere.", "",
             "- **Stale** (older than the code it checked): for the step's file or a `labkit` module it imports "
             "directly, the last commit touching it (`git log -1 --format=%H -- <path>`) is not an ancestor of the "
             "row's commit (`git merge-base --is-ancestor`). `import labkit` counts `labkit/__init__.py`; a "
             "subpackage counts its folder. Imports of imports are not followed.",
             "- **Merge**: the newest row per step wins; a step that never started leaves the older row in place.",
             "- **Choice**: missing first, then stale or unfinished, then oldest; each planned at its recorded wall "
             "time (1.5x for a step stopped mid-run), skipped when it no longer fits the deadline.", "",
             "## Ledger", ""] + render_table(rows)
    lines += ["", f"## Older than the code they checked{f' (as of `{as_of[:10]}`)' if as_of else ''}", ""]
    lines += [f"- `{s}`: {why}" for s, why in stale.items()] or ["None."]
    lines += ["", "## Never run on a GPU", ""] + ([", ".join(f"`{s}`" for s in never)] if never else ["None."])
    lines += ["", f"## Full mode against the {FULL_MODE_BUDGET_S:.0f} s budget (H100-class GPU)", "",
              "On one GPU, NCCL runs one rank only (`labkit.comm.backend.choose_backend`: one GPU per rank), so a "
              "notebook that starts ranks runs them as gloo CPU processes there and says so; only its single-process "
              "cells use the GPU. The last column reads the page's code (`launch(`, torchrun, a world size given); "
              "helpers that start ranks inside `labkit` (the ladder's DDP rung, notebook 11's sharding) are not seen "
              "by it.", ""]
    lines += budget_lines(repo, rows)
    over = [r.step for r in rows if r.kind == "notebook" and r.ran and r.wall_s is not None
            and (not r.finished or r.wall_s > FULL_MODE_BUDGET_S)]
    lines += ["", "Over the budget: " + ", ".join(f"`{s}`" for s in over) + "." if over else "No recorded notebook "
              "is over the budget."]
    lines += ["", f"## Next slot's plan (deadline {deadline_s:.0f} s)", ""]
    lines += plan_lines(choose_steps(rows, stale, deadline_s), deadline_s)
    lines += ["", "## Last slot", "", SLOT_START, *(slot or ["No slot has run since the ledger began."]), SLOT_END]
    lines += ["", "## Notes", "", NOTES_START, notes.strip(), NOTES_END]
    return "\n".join(lines).rstrip() + "\n"
