"""labkit.comm.rank_watch: a frozen (SIGSTOP) rank is told from one that waits, and named with how long."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from labkit.comm.rank_watch import RankWatch
from labkit.comm.stop import stop_group


def _sleepers(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
            for _ in range(n)]


def _wait_for_state(proc: subprocess.Popen, letter: str) -> None:
    deadline = time.monotonic() + 10
    while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != letter:
        assert time.monotonic() < deadline, f"process never reached state {letter}"
        time.sleep(0.01)


def test_a_stopped_rank_is_named_and_a_waiting_one_is_not():
    procs = _sleepers(2)
    try:
        watch = RankWatch(sample_every_s=0.0)
        watch.sample({0: procs[0].pid, 1: procs[1].pid})
        assert watch.frozen([0, 1]) == {}
        assert "rank(s) [0, 1] were still running" in watch.describe([0, 1])     # the rival: nobody named
        os.kill(procs[1].pid, signal.SIGSTOP)
        _wait_for_state(procs[1], "T")
        watch.sample({0: procs[0].pid, 1: procs[1].pid})
        time.sleep(0.2)
        frozen = watch.frozen([0, 1])
        assert list(frozen) == [1] and frozen[1] >= 0.2
        text = watch.describe([0, 1])
        assert text.startswith("rank 1 (for ") and "stopped answering" in text and "state T" in text
        assert "rank(s) [0] were waiting for it" in text
        os.kill(procs[1].pid, signal.SIGCONT)          # running again: no longer frozen
        _wait_for_state(procs[1], "S")
        assert watch.frozen([0, 1]) == {}
    finally:
        for proc in procs:
            stop_group(proc)


def test_ranks_not_started_or_already_gone_are_not_named():
    (proc,) = _sleepers(1)
    stop_group(proc)
    watch = RankWatch(sample_every_s=0.0)
    watch.sample({0: None, 1: proc.pid})
    assert watch.frozen([0, 1]) == {} and "were still running" in watch.describe([0, 1])


def test_sampling_is_throttled():
    procs = _sleepers(1)
    try:
        watch = RankWatch(sample_every_s=60.0)
        watch.sample({0: procs[0].pid})
        os.kill(procs[0].pid, signal.SIGSTOP)
        _wait_for_state(procs[0], "T")
        watch.sample({0: procs[0].pid})                # within the minute: not read again
        assert watch.frozen_since_s == {}
        assert list(watch.frozen([0])) == [0]          # the verdict at the timeout always reads afresh
    finally:
        stop_group(procs[0])
