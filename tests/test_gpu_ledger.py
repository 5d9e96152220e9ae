"""The GPU evidence ledger (scripts/gpu_ledger.py) and one slot of scripts/gpu_check.py, all without a GPU: rows
merge newest-first, staleness on a temporary git repo, the slot's choice fits its deadline and prefers missing and
stale steps, a step stopped mid-run (deadline or signal) still leaves the ledger written, the plan lists every
notebook."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))   # developer tooling lives in scripts/
from gpu_ledger import (NEVER, LedgerRow, all_steps, choose_steps, complete, imported_modules, merge_rows,  # noqa: E402
                        parse_ledger, planned_cost_s, render_table, stale_reasons, staleness)


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(step, date="2026-11-27", result="pass", wall=30.0, commit="abc1234", kind=None):
    return LedgerRow(step, kind or ("notebook" if step.endswith(".ipynb") else "test"), "H200", commit, date, result,
                     wall, "fig | with a pipe")


def test_the_table_reads_back_as_written():
    rows = [row("notebooks/01_a.ipynb"), LedgerRow("tests/t.py", "test"), row("b.py", wall=None, kind="benchmark")]
    back = parse_ledger("intro\n" + "\n".join(render_table(rows)) + "\nafter")
    assert [(r.step, r.result, r.wall_s) for r in back] == [("notebooks/01_a.ipynb", "pass", 30.0),
                                                             ("tests/t.py", NEVER, None), ("b.py", "pass", None)]
    assert back[0].figures == "fig / with a pipe" and parse_ledger("no table") == []


def test_merging_keeps_the_newest_row_per_step():
    old = [row("a", "2026-11-26", "FAIL"), row("b", "2026-11-27", "pass"), row("c", "2026-11-20")]
    new = [row("a", "2026-11-28 01:00", "pass"), row("b", "2026-11-25", "FAIL"), LedgerRow("c", "test"),
           row("d", "2026-11-28")]
    merged = {r.step: r for r in merge_rows(old, new)}
    assert merged["a"].result == "pass" and merged["a"].date.startswith("2026-11-28")     # newer wins
    assert merged["b"].result == "pass"                                                   # older never replaces
    assert merged["c"].date == "2026-11-20"                                               # a placeholder never does
    assert set(merged) == {"a", "b", "c", "d"}
    assert {r.step: r.result for r in merge_rows([row("a", "2026-11-28")], [row("a", "2026-11-28", "x")])} == \
        {"a": "x"}                                                                        # a tie: the new row


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


def _commit(repo, message):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def kit(tmp_path):
    """A tiny git repo shaped like the kit: a notebook importing labkit.core.a, a module it does not import."""
    for path, text in {"labkit/__init__.py": "", "labkit/core/__init__.py": "", "labkit/core/a.py": "X = 1\n",
                       "labkit/core/b.py": "Y = 1\n", "benchmarks/bench.py": "import labkit\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    cells = [{"cell_type": "code", "source": ["%matplotlib inline\n", "from labkit.core import a\n"]},
             {"cell_type": "markdown", "source": ["from labkit.core import b"]}]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_x.ipynb").write_text(json.dumps({"cells": cells}))
    _git(tmp_path, "init", "-q")
    return tmp_path, _commit(tmp_path, "first")


def test_a_row_is_stale_once_its_file_or_an_imported_module_changes(kit):
    repo, first = kit
    nb = "notebooks/01_x.ipynb"
    assert imported_modules(repo, nb) == ["labkit/core/a.py"]           # markdown cells are not code
    assert imported_modules(repo, "benchmarks/bench.py") == ["labkit/__init__.py"]   # not the whole kit
    fresh = [row(nb, commit=first[:10]), row("benchmarks/bench.py", commit=first, kind="benchmark")]
    assert stale_reasons(repo, fresh) == {}
    (repo / "labkit/core/b.py").write_text("Y = 2\n")                      # not imported: still fresh
    _commit(repo, "b")
    assert stale_reasons(repo, fresh) == {}
    (repo / "labkit/core/a.py").write_text("X = 2\n")
    second = _commit(repo, "a")
    why = stale_reasons(repo, fresh)
    assert list(why) == [nb] and "`labkit/core/a.py`" in why[nb] and first[:10] in why[nb]
    assert staleness(repo, row(nb, commit=second), [nb, "labkit/core/a.py"]) is None
    assert "not in this history" in staleness(repo, row(nb, commit="0" * 40), [nb])
    assert staleness(repo, LedgerRow(nb, "notebook"), [nb]) is None     # never ran: missing, not stale


def test_the_slot_fits_its_deadline_and_prefers_missing_then_stale_then_oldest():
    rows = [row("old.ipynb", "2026-11-20", wall=50), row("new.ipynb", "2026-11-27", wall=50),
            row("stale.ipynb", "2026-11-27", wall=50), LedgerRow("never.ipynb", "notebook"),
            row("cut.ipynb", "2026-11-27", "not finished (stopped at the deadline)", wall=100),
            row("huge.ipynb", "2026-11-19", wall=500)]
    choices = choose_steps(rows, {"stale.ipynb": "changed"}, deadline_s=200)
    assert [c.step for c in choices][:3] == ["never.ipynb", "cut.ipynb", "stale.ipynb"]
    chosen = [c for c in choices if c.chosen]
    assert [c.step for c in chosen] == ["never.ipynb", "stale.ipynb", "old.ipynb"]      # 60 + 50 + 50 s
    assert sum(c.cost_s for c in chosen) <= 200 and planned_cost_s(rows[4]) == 150   # stopped: 1.5x its time
    waiting = {c.step: c.note for c in choices if not c.chosen}
    assert waiting == {"cut.ipynb": "needs 150 s, 140 s left", "huge.ipynb": "needs 500 s, 90 s left",
                       "new.ipynb": "needs 50 s, 40 s left"}
    assert choose_steps(rows, {}, 200, only=("new.ipynb",))[0].chosen


def test_the_plan_lists_every_notebook_and_flags_the_climb(capsys):
    script = load_script()
    assert script.main(["--plan"]) == 0
    said = capsys.readouterr().out
    notebooks = [s for s in all_steps(REPO) if s.endswith(".ipynb")]
    assert len(notebooks) == len(list((REPO / "notebooks").glob("[0-9]*.ipynb"))) >= 20
    assert all(f"| `{nb}` |" in said for nb in notebooks)
    assert "planned against a deadline of 560 s" in said
    assert "| `notebooks/10_tuning_ladder.ipynb` | >= 433 (stopped) |" in said and "**OVER BUDGET**" in said


def _slot(script, tmp_path, monkeypatch, commands, deadline_s=60.0):
    """Run a slot over fake steps (``commands``: step -> python code) into a ledger in tmp_path."""
    monkeypatch.setattr(script, "step_command", lambda py, work, step: (sys.executable, "-c", commands[step]))
    ledger = tmp_path / "ledger.md"
    ledger.write_text("\n".join(render_table([])) + "\n<!-- notes:start -->\nkept\n<!-- notes:end -->\n")
    chosen = [script.Choice(s, "missing", 5.0, True) for s in commands]
    return ledger, lambda: script.run_slot(chosen, work=tmp_path, ledger=ledger, deadline_s=deadline_s,
                                           device="Mock GPU (2 GPUs)", commit="abc1234", env=dict(os.environ))


def test_a_step_stopped_at_the_deadline_is_written_not_finished(tmp_path, monkeypatch):
    script = load_script()
    ledger, run = _slot(script, tmp_path, monkeypatch, {"notebooks/01_gpu_utilization.ipynb": "pass",
                                                        "notebooks/02_batch_size.ipynb": "import time; time.sleep(60)",
                                                        "benchmarks/loop_overhead.py": "pass"}, deadline_s=3.0)
    fates = run()
    rows = {r.step: r for r in parse_ledger(ledger.read_text())}
    assert rows["notebooks/01_gpu_utilization.ipynb"].result == "ran"
    assert rows["notebooks/02_batch_size.ipynb"].result.startswith("not finished (stopped at its limit")
    assert rows["notebooks/02_batch_size.ipynb"].device == "Mock GPU (2 GPUs)"
    assert rows["benchmarks/loop_overhead.py"].result == NEVER                 # never started: no row made up
    assert any(f.startswith("benchmarks/loop_overhead.py: never started") for f in fates)
    text = ledger.read_text()
    assert "## Last slot" in text and "kept" in text and set(all_steps(REPO)) <= set(rows)


def test_a_slot_stopped_by_a_signal_writes_the_ledger_and_leaves_no_process(tmp_path, monkeypatch):
    script = load_script()
    pidfile = tmp_path / "child.pid"
    kill_parent = (f"import os, signal, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
                   "time.sleep(0.5); os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)")   # parent waits by then
    ledger, run = _slot(script, tmp_path, monkeypatch, {"notebooks/13_tensor_parallelism.ipynb": "pass",
                                                        "notebooks/14_which_parallelism.ipynb": kill_parent,
                                                        "benchmarks/memory_check.py": "pass"})
    before = signal.signal(signal.SIGTERM, script._raise_stop)
    try:
        with pytest.raises(script.SlotStopped):
            run()
    finally:
        signal.signal(signal.SIGTERM, before)
    rows = {r.step: r for r in parse_ledger(ledger.read_text())}
    assert rows["notebooks/13_tensor_parallelism.ipynb"].result == "ran"
    assert rows["notebooks/14_which_parallelism.ipynb"].result == \
        "not finished (the slot was stopped: SlotStopped SIGTERM)"
    assert rows["benchmarks/memory_check.py"].result == NEVER
    assert "`benchmarks/memory_check.py` (budget 5 s): never started" in ledger.read_text()
    assert not psutil.pid_exists(int(pidfile.read_text()))               # the step's process group was stopped


def test_complete_gives_every_step_a_row_in_order():
    rows = complete([row("b"), row("gone.ipynb"), LedgerRow("gone_never.ipynb", "notebook")], ["a", "b"])
    assert [(r.step, r.result) for r in rows] == [("a", NEVER), ("b", "pass"), ("gone.ipynb", "pass")]


def test_outside_git_nothing_is_called_stale(tmp_path, monkeypatch):
    """A lent box gets the tree without .git (or without git): rows read as current, the ledger still renders."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_x.ipynb").write_text(json.dumps({"cells": []}))
    assert stale_reasons(tmp_path, [row("notebooks/01_x.ipynb")]) == {}
    monkeypatch.setenv("PATH", str(tmp_path))                              # no git at all
    assert stale_reasons(tmp_path, [row("notebooks/01_x.ipynb")]) == {}
