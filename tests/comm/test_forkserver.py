"""The rank forkserver: which runs fork, ranks that share one torch-loaded parent, a server that fails clearly."""
from __future__ import annotations

import os
import sys

import psutil
import pytest

from labkit.comm.forkserver import RankForkServer, forkserver_available, uses_forkserver
from labkit.comm.launch import LaunchError, launch


# ---- functions the worker processes import by name (this module is importable from the children)
def parent_and_own_pid() -> tuple[int, int]:
    return os.getppid(), os.getpid()


# ---- the choice
def test_auto_forks_gloo_runs_only():
    assert uses_forkserver("auto", "gloo") == forkserver_available()
    assert not uses_forkserver("auto", "nccl")       # a GPU run starts fresh interpreters
    assert not uses_forkserver("fresh", "gloo")
    assert uses_forkserver("forkserver", "gloo")
    with pytest.raises(ValueError, match="start_method must be one of"):
        uses_forkserver("spawn", "gloo")


# ---- forked ranks
@pytest.mark.skipif(not forkserver_available(), reason="the forkserver needs Linux")
def test_forked_ranks_share_one_server_that_is_gone_after_the_call():
    ranks = launch(parent_and_own_pid, 2, start_method="forkserver", show_output=False)
    (server, pid0), (server1, pid1) = ranks
    assert server == server1 and server not in (os.getpid(), pid0, pid1)
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    fresh = launch(parent_and_own_pid, 2, start_method="fresh", show_output=False)
    assert [parent for parent, _ in fresh] == [os.getpid()] * 2


@pytest.mark.skipif(not forkserver_available(), reason="the forkserver needs Linux")
def test_a_server_that_cannot_start_fails_every_rank_with_its_stderr(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_PARENT_PID"}
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    server = RankForkServer(tmp_path, 2, "labkit.comm.demos", env)   # no LABKIT_PARENT_PID: dies at once
    assert [rank.wait(60) for rank in server.ranks] == [1, 1]
    server.close(lambda pid: None)
    assert server.failed_to_fork and "LABKIT_PARENT_PID" in server.error_text()


def test_launch_reports_a_server_failure_as_a_launch_error(monkeypatch):
    monkeypatch.setattr("labkit.comm.forkserver._SERVER_CODE", "import sys; sys.exit('no server today')")
    with pytest.raises(LaunchError, match="(?s)forkserver stopped.*no server today"):
        launch("labkit.comm.demos:all_reduce_sum", 2, start_method="forkserver", show_output=False, timeout_s=60)
