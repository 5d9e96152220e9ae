"""The first failure of a job across emulated nodes, named where it happened: a node killed, a link deleted."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import psutil
import pytest

from labkit.cluster.faults import LINK_EVERY_S, JobWatch, NodeFault, exit_words, fault_message, node_ranks
from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.run import RANK_MARKS, JobFailed, run_job
from labkit.core.clock import Deadline

SLEEPER = "tests.launch_support:sleep_forever"


def test_exit_words_name_the_signal_and_who_sends_it():
    assert exit_words(1) == "exited with code 1"
    assert exit_words(-9) == "was killed by SIGKILL (kill -9, or the kernel's out-of-memory killer)"
    assert exit_words(-15) == "was killed by SIGTERM"


def test_the_message_names_node_ranks_and_cause_in_two_lines_then_its_own_output():
    watch = JobWatch([1, -9], NodeFault(1, "its launcher was killed by SIGKILL", 3.25), {0: [0, 1], 1: [2, 3]})
    text = fault_message("a.b:c", watch, ["node 0's torch dump\n" * 41, "step 7\n\n"])
    lines = text.splitlines()
    assert lines[0] == "a.b:c: node 1 (ranks 2, 3) failed first, 3.2 s in: its launcher was killed by SIGKILL."
    assert lines[1].startswith("Every process on every node was then stopped")
    assert lines[2:] == ["Node 1's last lines:", "step 7"] and "torch dump" not in text
    with pytest.raises(ValueError):
        fault_message("a.b:c", JobWatch([0, 0]), ["", ""])


@pytest.fixture(scope="module")
def nodes(namespaces_here):
    with EmulatedNodes(NodesConfig(nodes=2, rate_mbit_s=500)) as built:
        yield built


def _when_node1_runs(nodes: EmulatedNodes, act) -> callable:
    """A ``while_running`` hook: mid-job (node 1's ranks up for two looks of the watch), ``act()`` from a thread,
    as the probe did to node 1 from another shell."""
    def later(procs, run_dir) -> None:
        deadline = Deadline(90)
        while not node_ranks(nodes, 1, run_dir / RANK_MARKS) and not deadline.expired and procs[1].poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[1].wait(timeout=0.3)
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs[1].wait(timeout=2 * LINK_EVERY_S + 0.5)
        act()

    return lambda procs, run_dir: threading.Thread(target=later, args=(procs, run_dir), daemon=True).start()


def _kill_node1(nodes: EmulatedNodes) -> None:
    for pid in nodes.pids(1):
        os.kill(pid, signal.SIGKILL)


def test_a_node_killed_with_kill_9_is_named_not_the_node_that_followed(nodes):
    with pytest.raises(JobFailed) as failed:
        run_job(nodes, SLEEPER, nproc_per_node=1, timeout_s=120,
                while_running=_when_node1_runs(nodes, lambda: _kill_node1(nodes)))
    first = str(failed.value).splitlines()[0]
    assert "node 1 (rank" in first and "failed first" in first and "killed by SIGKILL" in first, str(failed.value)
    assert nodes.pids(0) == [] and nodes.pids(1) == []


def test_a_deleted_link_is_named_at_once_not_after_the_timeout(nodes):
    from labkit.core.clock import now_s

    started = now_s()
    try:
        with pytest.raises(JobFailed) as failed:
            run_job(nodes, SLEEPER, nproc_per_node=1, timeout_s=120,
                    while_running=_when_node1_runs(nodes, lambda: nodes.host_run(["ip", "link", "del", "sw1"])))
    finally:
        nodes.close()                     # the module's nodes lost a cable: rebuild them for any later test
        nodes.start()
    assert "node 1" in str(failed.value) and "lost its link (sw1" in str(failed.value), str(failed.value)
    assert now_s() - started < 100


class _UntilRankOneIsStopped:
    """watch_job's deadline, made to expire 1 s after rank 1's process is seen stopped (state T), or at 180 s: the
    timeout comes with rank 1 certainly frozen, however slow the nodes' start-up on a busy machine."""

    def __init__(self, marks) -> None:
        self.marks, self.start, self.seen = marks, time.monotonic(), None

    @property
    def expired(self) -> bool:
        now = time.monotonic()
        if self.seen is None:
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                if psutil.Process(int((self.marks / "rank1.pid").read_text())).status() == psutil.STATUS_STOPPED:
                    self.seen = now
        return now - self.start > 180 or (self.seen is not None and now - self.seen > 1.0)

    @property
    def remaining_s(self) -> float:
        return 0.2


def test_a_frozen_rank_is_named_at_the_timeout_with_its_node(nodes, tmp_path, monkeypatch):
    """A rank stopped with SIGSTOP (state T throughout) was a bare timeout ('Node 0's last lines:' and nothing)."""
    import labkit.cluster.faults as faults

    monkeypatch.setattr(faults, "Deadline", lambda s: _UntilRankOneIsStopped(tmp_path / RANK_MARKS))
    with pytest.raises(TimeoutError) as timed_out:
        run_job(nodes, "tests.launch_support:rank_one_freezes", nproc_per_node=1, timeout_s=25, result_dir=tmp_path)
    text = str(timed_out.value)
    assert "rank 1 (node 1) stopped answering within the 25 s timeout" in text and "state T" in text, text
    assert "rank 0" not in text.splitlines()[0]
    assert nodes.pids(0) == [] and nodes.pids(1) == []
