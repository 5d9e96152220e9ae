"""torchft replica groups on gloo: one SIGKILLed at a marked step, the survivor trains on in the same process, and
nothing (process, lighthouse, temporary folder) is left behind; runs once (about 20 s), skipped without torchft."""
import dataclasses
import importlib.util
import socket
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import psutil
import pytest

from labkit.checkpoint import replicas
from labkit.checkpoint.replicas import ReplicaConfig, judge_loss_falls, judge_survival, run_replicas, steps_after_kill

CFG = ReplicaConfig.fast()


def _our_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("labkit-replicas-*"))


@pytest.fixture(scope="module")
def record():
    pytest.importorskip("torchft", reason="torchft is not installed (`pip install torchft==0.2.*`)")
    before = _our_folders()
    rec = run_replicas(CFG)
    return rec, _our_folders() - before


def test_the_victim_is_killed_right_after_the_step_it_marked(record):
    rec, _ = record
    victim_rows = rec.rows[rec.victim]
    assert rec.kill_step == CFG.kill_after_step
    assert victim_rows[-1]["step"] == CFG.kill_after_step       # it logged nothing after its mark
    assert victim_rows[-1]["t"] <= rec.kill_t_s


def test_the_survivor_trains_on_past_the_kill_in_the_same_process(record):
    rec, _ = record
    verdict = judge_survival(rec)
    assert verdict.holds, verdict.detail
    rows = rec.rows[rec.survivor]
    after = steps_after_kill(rec, rec.survivor)
    assert len({r["pid"] for r in rows}) == 1
    assert [r["step"] for r in after] == list(range(CFG.kill_after_step + 1, CFG.steps + 1))
    assert {r["participants"] for r in after} == {1}
    assert rows[0]["participants"] == 2
    assert rec.quorums[0] == 2 and rec.quorums[-1] == 1      # the lighthouse's own log agrees


def test_the_survivors_loss_keeps_falling(record):
    verdict = judge_loss_falls(record[0])
    assert verdict.holds, verdict.detail


def test_nothing_is_left_behind(record):
    rec, new_folders = record
    assert rec.leftover_pids == []
    pids = {r["pid"] for rows in rec.rows.values() for r in rows}
    assert len(pids) == CFG.replicas and not any(psutil.pid_exists(p) for p in pids)
    assert not Path(rec.folder).exists() and not new_folders
    with socket.socket() as sock:                               # the lighthouse no longer listens
        assert sock.connect_ex(("127.0.0.1", rec.lighthouse_port)) != 0


def test_the_verdicts_reject_their_rivals():
    """A run whose survivor stopped at the kill (the rival) fails both claims."""
    rows = {0: [{"step": s, "loss": 1.0, "t": s / 10, "pid": 7, "participants": 2, "committed": True}
                for s in range(1, 9)], 1: []}
    stopped = replicas.ReplicaRecord(CFG, rows, 1, 0, 8, 0.85, 1.0, [2] * 8, "/nonexistent", 1, [])
    assert not judge_survival(stopped).holds
    assert not judge_loss_falls(stopped).holds
    restarted = dataclasses.replace(stopped, rows={0: rows[0] + [{**rows[0][-1], "t": 2.0, "step": 60, "pid": 8,
                                                                  "participants": 1}], 1: []})
    assert "pid [7, 8]" in judge_survival(restarted).detail and not judge_survival(restarted).holds


def test_the_figure_draws_each_replica(record):
    fig = replicas.replicas_figure(record[0])
    top, bottom = fig.axes
    assert len([line for line in top.get_lines() if len(line.get_xdata()) > 2]) == CFG.replicas
    plt.close(fig)


def test_a_run_that_times_out_is_one_line_and_leaves_nothing(tmp_path):
    pytest.importorskip("torchft", reason="torchft is not installed (`pip install torchft==0.2.*`)")
    before = _our_folders()
    with pytest.raises(RuntimeError, match="timed out after 0.5 s") as err:
        run_replicas(dataclasses.replace(CFG, timeout_s=0.5))
    assert "\n" not in str(err.value)
    assert _our_folders() == before
    assert not [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("kwargs, words", [({"steps": 5, "kill_after_step": 8}, "must exceed kill_after_step"),
                                           ({"replicas": 1}, "replicas"), ({"timeout_s": 0}, "timeout_s")])
def test_a_bad_argument_is_one_line(kwargs, words):
    with pytest.raises(ValueError, match=words) as err:
        ReplicaConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_without_torchft_the_run_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a))
    assert "pip install torchft" in replicas.torchft_missing_reason()
    with pytest.raises(RuntimeError, match="torchft is not installed"):
        run_replicas(CFG)


def test_a_pid_reused_by_another_program_is_not_a_leftover(tmp_path):
    """Only a process whose command line names the run's folder is this run's; the kernel reuses pids."""
    import subprocess
    import sys

    from labkit.checkpoint.replicas import still_ours

    script = tmp_path / "replicas.py"
    script.write_text("import time\ntime.sleep(30)\n")
    ours = subprocess.Popen([sys.executable, str(script)])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert still_ours(ours.pid, tmp_path) and not still_ours(other.pid, tmp_path)
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
    assert not still_ours(ours.pid, tmp_path)          # gone (or another program's now)
