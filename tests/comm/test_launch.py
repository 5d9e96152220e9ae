"""The launcher: results, output order, errors, timeouts and no orphaned processes (real gloo processes)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

import labkit.comm.launch as ld
from labkit.comm.launch import LaunchTimeout, RankFailedError, launch, target_name
from labkit.comm.stop import wait_vanished
from tests.launch_support import MARKER_ENV, SERVER_SLEEP_ENV, parent_of_sleeping_ranks, start_parent

REPO = Path(__file__).resolve().parents[2]
WORKER_MARK = "labkit.comm.worker"


# ---- functions the worker processes import by name (this module is importable from the children)
def report_and_print(lines: int = 3) -> tuple:
    rank = dist.get_rank()
    for i in range(lines):
        print(f"line {i} from rank {rank}", flush=True)
        time.sleep(0.05)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return rank, dist.get_world_size(), dist.get_backend(), torch.get_num_threads(), t.item()


def fail_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank one is unhappy")
    dist.barrier()


def sleep_forever() -> None:
    time.sleep(600)


def rank_one_never_joins() -> None:
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))


def _worker_children() -> list[psutil.Process]:
    """Descendants of this test process that are launcher workers."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(WORKER_MARK in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def _cmdline(proc: psutil.Process) -> list[str]:
    """Its command line; [] for a process that ended (or became a zombie) as it was read."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _assert_no_orphans() -> None:
    assert _worker_children() == []


# ---- happy path
@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_returns_values_in_rank_order_and_prints_output_rank_by_rank(capsys, start_method):
    results = launch(report_and_print, 2, timeout_s=90, start_method=start_method)
    assert [r[0] for r in results] == [0, 1]
    assert all(r[1] == 2 and r[2] == "gloo" for r in results)
    assert all(r[3] == 1 for r in results)  # one torch thread per rank by default (no oversubscription)
    assert all(r[4] == 3.0 for r in results)  # 1 + 2 summed by a real all_reduce
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "line" in ln]
    assert lines == [f"[rank {r}] line {i} from rank {r}" for r in range(2) for i in range(3)]
    _assert_no_orphans()


def test_string_target_and_world_of_one():
    assert launch("labkit.comm.demos:all_reduce_sum", 1, timeout_s=90, show_output=False)[0]["after"] == \
        [1.0, 2.0, 3.0, 4.0]


# ---- failures
@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_failing_rank_traceback_is_reraised_and_children_cleaned_up(start_method):
    with pytest.raises(RankFailedError) as info:
        launch(fail_on_rank_one, 2, timeout_s=90, pg_timeout_s=30, show_output=False, start_method=start_method)
    err = info.value
    assert err.rank == 1
    assert "ValueError: rank one is unhappy" in str(err)
    assert "fail_on_rank_one" in err.remote_traceback
    _assert_no_orphans()


@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_timeout_kills_every_rank_and_names_them(start_method):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match=r"rank\(s\) \[0, 1\] were still running"):
        launch(sleep_forever, 2, timeout_s=3, show_output=False, start_method=start_method)
    assert time.monotonic() - start < 30
    _assert_no_orphans()


def test_pg_timeout_turns_a_stuck_collective_into_an_error():
    with pytest.raises(RankFailedError) as info:
        launch(rank_one_never_joins, 2, timeout_s=90, pg_timeout_s=3, show_output=False)
    assert info.value.rank == 0  # rank 0 waited in all_reduce for a partner that never came
    _assert_no_orphans()


@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_keyboard_interrupt_stops_all_children(monkeypatch, start_method):
    def interrupted_wait(procs, timeout_s, run_dir, on_result=None, watch=None):
        assert all(p.poll() is None for p in procs)
        raise KeyboardInterrupt

    monkeypatch.setattr(ld, "_wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        launch(sleep_forever, 2, timeout_s=60, show_output=False, start_method=start_method)
    _assert_no_orphans()


# ---- bad input: one clear error, no process started
def _nested():
    def inner():
        return 1
    return inner


@pytest.mark.parametrize("fn", [lambda: 1, _nested()], ids=["lambda", "nested"])
def test_functions_without_an_importable_name_are_refused(fn):
    with pytest.raises(ValueError, match="Move it into a module"):
        launch(fn, 2)


def test_notebook_function_is_refused():
    fn = _nested()
    fn.__module__, fn.__qualname__ = "__main__", "train"
    with pytest.raises(ValueError, match="notebook cell"):
        target_name(fn)


@pytest.mark.parametrize("world_size", [0, -1, 2.0, "2", True])
def test_bad_world_size(world_size):
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        launch(report_and_print, world_size)


def test_world_size_beyond_the_machine():
    with pytest.raises(ValueError, match="processes per CPU core"):
        launch(report_and_print, 1000)


def test_nccl_without_enough_gpus():
    if torch.cuda.device_count() >= 64:
        pytest.skip("this machine has 64 GPUs")
    with pytest.raises(ValueError, match="one CUDA GPU per rank"):
        launch(report_and_print, 64, backend="nccl")


@pytest.mark.parametrize("kwargs,match", [({"backend": "mpi"}, "backend must be one of"),
                                          ({"timeout_s": 0}, "timeout_s must be a number > 0"),
                                          ({"pg_timeout_s": -1}, "pg_timeout_s must be a number > 0"),
                                          ({"threads_per_rank": 0}, "threads_per_rank"),
                                          ({"start_method": "spawn"}, "start_method must be one of"),
                                          ({"args": (threading.Lock(),)}, "cannot be pickled")])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch(report_and_print, 2, **kwargs)


def test_bad_string_targets():
    with pytest.raises(ValueError, match="package.module:function"):
        launch("labkit.comm.demos.all_reduce_sum", 2)
    with pytest.raises(ValueError, match="cannot import"):
        launch("labkit.comm.demos:no_such_function", 2)


# ---- the backend rule, applied before any process starts
def test_explicit_nccl_on_too_few_gpus_is_refused_up_front(gpus):
    gpus(1)
    with pytest.raises(ValueError, match=r"one CUDA GPU per rank: 2 rank\(s\) on this node but 1 GPU\(s\)"):
        launch(report_and_print, 2, backend="nccl")


# ---- SIGTERM: like Ctrl-C, no live workers and no temp dir with the pickled payload left behind
@pytest.mark.parametrize("lazy_reaper", [False, True], ids=["init", "lazy-reaper"])
@pytest.mark.parametrize("start_method,processes", [("fresh", 2), ("forkserver", 3)])
def test_sigterm_to_the_launcher_kills_workers_and_removes_the_temp_dir(tmp_path, start_method, processes,
                                                                        lazy_reaper):
    """Under a lazy reaper (an init slow to reap orphans, as on the fresh clone where this failed) the killed
    forkserver's ranks stay zombies: exited, so gone (psutil.wait_procs would count them alive)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with parent_of_sleeping_ranks(tmp_path, start_method, lazy_reaper, env={**os.environ, "TMPDIR": str(tmp)},
                                  stderr=subprocess.DEVNULL) as (parent, kids):
        assert len(kids) == processes and list(tmp.glob("labkit-launch-*"))
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 143
        assert wait_vanished(kids, 5) == [] and list(tmp.glob("labkit-launch-*")) == []


# ---- a signal while the rank forkserver starts up: it is stopped before any rank runs
def test_sigterm_while_the_forkserver_starts_stops_it_before_any_rank_runs(tmp_path):
    """Signalled while its forkserver still imports the target's module (the last 0.3 s of it made certain here),
    the launcher kills it at once: the server used to get a 2 s grace to report its ranks, and forked them in it
    (they ran after the signal, as `labkit allreduce-bench` measured 7 sizes after a SIGTERM)."""
    marks, tmp = tmp_path / "marks", tmp_path / "tmp"
    marks.mkdir(), tmp.mkdir()
    env = {**os.environ, SERVER_SLEEP_ENV: "0.3", MARKER_ENV: str(marks), "TMPDIR": str(tmp)}
    parent = start_parent(tmp_path, "forkserver", "tests.launch_support:mark_then_sleep", env=env,
                          stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (marks / "server").exists() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.005)
        server = next(k for k in psutil.Process(parent.pid).children() if "serve_forks" in " ".join(_cmdline(k)))
        assert server.children() == []      # started, no rank forked yet
        signalled = time.monotonic()
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 143
        took_s = time.monotonic() - signalled
        time.sleep(1.5)                     # a rank forked in a grace would have run and left its mark by now
        assert sorted(p.name for p in marks.iterdir()) == ["server"]       # no rank ran
        family = [server]
        assert wait_vanished(family, 5) == [] and list(tmp.glob("labkit-launch-*")) == []
        assert took_s < 10, f"the launcher took {took_s:.1f} s to stop"   # a bound on a hang: the marks decide
    finally:
        ld.stop_group(parent)


@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_a_signal_that_lands_while_a_process_starts_loses_no_process(tmp_path, monkeypatch, start_method):
    """SIGTERM delivered inside Popen (after the fork, before it returns) used to unwind with the child unknown,
    so it ran on: the signal is now held until the process is recorded, then stops it."""
    import labkit.comm.forkserver as fs

    real_popen, started = subprocess.Popen, []

    def popen_then_signal(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGTERM)      # the handler runs before this function returns
        time.sleep(0.1)
        return proc

    monkeypatch.setattr(fs.subprocess if start_method == "forkserver" else ld.subprocess, "Popen", popen_then_signal)
    monkeypatch.setenv(MARKER_ENV, str(tmp_path))
    from labkit.core.results import Terminated
    with pytest.raises(Terminated):
        launch("tests.launch_support:mark_then_sleep", 2, timeout_s=60, show_output=False, start_method=start_method)
    assert len(started) == 1 and started[0].poll() is not None
    time.sleep(1.0)
    assert list(tmp_path.iterdir()) == []
    _assert_no_orphans()


# ---- a frozen rank is named
def stop_rank_one() -> None:
    """Rank 1 freezes itself (SIGSTOP) once the group is up, leaving a mark first; rank 0 waits in an all-reduce."""
    if dist.get_rank() == 1:
        Path(os.environ[MARKER_ENV], "1").write_text("stopping")
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))


class _UntilRankOneFroze:
    """The launch's deadline, made to expire 1 s after rank 1 froze (its mark), or at 120 s: the timeout then comes
    with rank 1 certainly stopped, however slow the start-up on a busy machine."""

    def __init__(self, marks: Path) -> None:
        self.marks, self.start, self.seen = marks, time.monotonic(), None

    @property
    def expired(self) -> bool:
        now = time.monotonic()
        if self.seen is None and (self.marks / "1").exists():
            self.seen = now
        return now - self.start > 120 or (self.seen is not None and now - self.seen > 1.0)


@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_a_frozen_rank_is_named_as_the_one_that_stopped_answering(tmp_path, monkeypatch, start_method):
    """The rival: 'rank(s) [0, 1] were still running', the waiting rank 0 named beside the frozen one."""
    monkeypatch.setenv(MARKER_ENV, str(tmp_path))
    real_deadline = ld.Deadline
    monkeypatch.setattr(ld, "Deadline", lambda s: _UntilRankOneFroze(tmp_path) if s == 8 else real_deadline(s))
    with pytest.raises(LaunchTimeout) as info:
        launch(stop_rank_one, 2, timeout_s=8, show_output=False, start_method=start_method)
    message = str(info.value)
    assert (tmp_path / "1").exists(), message
    assert "rank 1 (for " in message and "stopped answering" in message and "state T" in message, message
    assert "rank(s) [0] were waiting for it" in message and "[0, 1]" not in message
    _assert_no_orphans()                         # the stopped rank was killed too


@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_a_peer_that_times_out_waiting_for_a_frozen_rank_names_the_frozen_one(tmp_path, monkeypatch, start_method):
    """Issue 53: with a collective timeout shorter than the launch's, the waiting rank 0 raises first; the failure
    must name rank 1, frozen, as the cause (the rival: 'rank 0 failed' with rank 0's timeout as the story)."""
    monkeypatch.setenv(MARKER_ENV, str(tmp_path))
    with pytest.raises(RankFailedError) as info:
        launch(stop_rank_one, 2, timeout_s=60, pg_timeout_s=2, show_output=False, start_method=start_method)
    summary = info.value.summary
    assert (tmp_path / "1").exists(), summary
    assert summary.startswith("rank 1 (for ") and "stopped answering" in summary and "state T" in summary, summary
    assert "rank 0 failed waiting for it" in summary and info.value.rank == 0, summary
    _assert_no_orphans()                         # the stopped rank was killed too
