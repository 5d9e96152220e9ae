"""Tests for labkit.comm.stop: one signal reaches a launched session's whole family; a gone group is no error."""
from __future__ import annotations

import subprocess
import sys

import psutil

from labkit.comm.stop import stop_group

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
        gone, alive = psutil.wait_procs(children, timeout=5)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_group_of_a_group_that_is_gone_is_quiet():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    stop_group(proc)
    stop_group(proc.pid)
