"""Tests for labkit.comm.stop: one signal reaches a launched session's whole family; a gone group is no error."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from labkit.comm.stop import has_exited, pid_has_exited, stop_group, wait_vanished
from tests.launch_support import a_zombie

# a leader that starts a child in its own group, then both sleep (and the leader ignores SIGTERM)
_FAMILY = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('up', flush=True); "
           "time.sleep(60)")


def _family() -> tuple[subprocess.Popen, list[psutil.Process]]:
    proc = subprocess.Popen([sys.executable, "-c", _FAMILY], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    return proc, psutil.Process(proc.pid).children(recursive=True)


def test_stop_group_kills_the_leader_and_its_children_after_the_grace():
    proc, children = _family()
    try:
        stop_group(proc, grace_s=0.3)          # SIGTERM is ignored: SIGKILL after the grace ends both
        assert proc.returncode is not None
        assert wait_vanished(children, 5) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_group_of_a_group_that_is_gone_is_quiet():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    stop_group(proc)
    stop_group(proc.pid)


TRAPS_SIGTERM = ("import pathlib, signal, sys, time\n"
                 "def tidy(*_):\n"
                 "    pathlib.Path(sys.argv[1]).write_text('tidied'); sys.exit(0)\n"
                 "signal.signal(signal.SIGTERM, tidy); print('ready', flush=True); time.sleep(60)\n")


@pytest.mark.parametrize("grace_s, tidied", [(0.0, False), (5.0, True)])
def test_stop_group_lets_a_launcher_tidy_up_only_with_a_grace(tmp_path, grace_s, tidied):
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", TRAPS_SIGTERM, str(marker)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    stop_group(proc, grace_s=grace_s)
    assert proc.wait(timeout=10) is not None
    assert marker.exists() is tidied


def test_a_child_in_a_session_of_its_own_is_stopped_too():
    """A forked rank or a loader worker may start its own session: the group signal misses it, the family read
    before the first signal does not."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            "start_new_session=True); print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    (child,) = psutil.Process(proc.pid).children(recursive=True)
    assert os.getpgid(child.pid) != proc.pid
    stop_group(proc)
    assert proc.returncode is not None
    assert wait_vanished([child], 5) == []


def test_an_exited_and_reaped_popen_is_not_looked_up_again():
    """Its pid may already belong to another process: nothing is read or signalled through it but its group."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    code = proc.returncode
    stop_group(proc, grace_s=1.0)
    assert proc.returncode == code


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_launcher_still_starting_workers_in_their_own_sessions_loses_none(tmp_path):
    """torchrun starts each worker in a session of its own, and may be starting them as the stop comes: the
    launcher is frozen before its family is read for the last time, so no worker born during the grace survives."""
    pids = tmp_path / "pids"
    worker = f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', "
            "flush=True)\nwhile True:\n    subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
            "start_new_session=True); time.sleep(0.05)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, worker], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    stop_group(proc, grace_s=1.0)                  # the launcher ignores SIGTERM and keeps starting workers
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) >= 3
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in started if _alive(pid)] == []


# ---- a zombie has exited: its parent (or an init slow to reap orphans) just has not collected it yet
def test_a_zombie_counts_as_exited_where_psutil_wait_procs_counts_it_alive():
    with a_zombie() as zombie:
        assert zombie.status() == psutil.STATUS_ZOMBIE
        assert psutil.wait_procs([zombie], timeout=0.2)[1] == [zombie]     # the pattern that failed on a fresh clone
        start = time.monotonic()
        assert has_exited(zombie) and pid_has_exited(zombie.pid) and wait_vanished([zombie], 5) == []
        assert time.monotonic() - start < 1.0


def test_a_running_process_has_not_exited_and_is_waited_for():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        child = psutil.Process(proc.pid)
        assert not has_exited(child) and not pid_has_exited(proc.pid)
        start = time.monotonic()
        assert wait_vanished([child], 0.3) == [child]
        assert time.monotonic() - start >= 0.3
    finally:
        stop_group(proc)
    assert pid_has_exited(proc.pid) and wait_vanished([child], 0) == []
