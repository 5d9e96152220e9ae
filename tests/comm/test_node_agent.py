"""torchrun's agent in-process with forked ranks: the same job as the torchrun command, one torch import per node."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from labkit.comm.node_agent import run_forked_agent
from labkit.comm.ports import reserved_port

TARGET = "labkit.comm.demos:all_reduce_sum"
ENV = {k: v for k, v in {**os.environ, "OMP_NUM_THREADS": "1"}.items()
       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")}


def test_only_a_labkit_launch_command_is_accepted():
    with pytest.raises(ValueError, match="-m labkit launch TARGET"):
        run_forked_agent(["torchrun", "--nnodes=1", "script.py"])


def test_a_one_node_job_with_forked_ranks_runs_every_rank():
    with reserved_port() as port:
        proc = subprocess.run([sys.executable, "-m", "labkit", "launch", "--nnodes", "1", "--node-rank", "0",
                               "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr",
                               "127.0.0.1", "--fork-workers", "--timeout", "120", TARGET],
                              capture_output=True, text=True, env=ENV, timeout=180)
    assert proc.returncode == 0, f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-6000:]}"   # stacks of a hung rank
    assert proc.stdout.count(f"{TARGET} -> ") == 2, proc.stdout


def sleep_a_minute() -> None:
    """A rank's target that outlives its job's --timeout (imported by the launched agent from this file)."""
    import time
    time.sleep(60)


def test_a_forked_rank_still_running_near_the_deadline_prints_where_it_waits():
    """A rank that never returns (here: a sleep) writes its Python stack before the agent's deadline stops it."""
    with reserved_port() as port:
        proc = subprocess.run([sys.executable, "-m", "labkit", "launch", "--nnodes", "1", "--node-rank", "0",
                               "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr",
                               "127.0.0.1", "--fork-workers", "--timeout", "8", f"{__name__}:sleep_a_minute"],
                              capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode != 0 and "did not finish within --timeout 8 s" in proc.stderr, proc.stderr[-3000:]
    assert "Timeout (0:00:07" in proc.stderr and "in sleep_a_minute" in proc.stderr, proc.stderr[-3000:]
