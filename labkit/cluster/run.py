"""Run a job across the emulated nodes the way a cluster does: ``labkit launch --nnodes ...`` on every node.

Each node runs ``python -m labkit launch --nnodes N --node-rank K --nproc-per-node P --rdzv-endpoint
10.77.0.1:PORT --local-addr 10.77.0.<K+1> TARGET`` in its own network namespace; that starts torchrun, whose c10d
rendezvous joins the nodes. Gloo is told to use ``eth0`` (``GLOO_SOCKET_IFNAME``), so traffic between nodes crosses
the shaped link, while traffic to a rank's own node goes to the node's own address and stays on its loopback.
The job's parameters travel as JSON in ``LABKIT_JOB``; every rank writes its result as JSON into
``LABKIT_RESULT_DIR`` (:mod:`labkit.cluster.rankside`). Every run has a timeout; on timeout or failure every
process on every node is killed and the error names the node and shows its last lines.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from labkit.cluster.faults import JobWatch, fault_message, watch_job
from labkit.cluster.nodes import EmulatedNodes, node_address
from labkit.core.clock import now_s
from labkit.core.validation import positive_int, positive_number

RDZV_PORT = 29400
RANK_MARKS = "rank-pids"      # the ranks' pid marks (labkit.comm.worker.mark_rank): which node holds which rank
# glibc raises its mmap threshold to the largest block freed (up to 32 MiB), so a rank that freed a 16 MiB message
# serves later ones from its heap and keeps the pages: a fixed 1 MiB threshold maps each large block and returns it
# at free (notebook 12's link lab: 1,645 -> 1,529 MiB PSS over its ranks, agents and this process at its peak)
RANK_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}


class JobFailed(RuntimeError):
    """A multi-node job did not finish: which node, and the last lines it printed."""


@dataclass
class JobResult:
    """What every rank reported (rank order), each node's output, and the job's wall time."""

    results: list[dict[str, Any]]
    outputs: list[str] = field(repr=False)
    wall_s: float


def node_command(target: str, node: int, nnodes: int, nproc_per_node: int, timeout_s: float,
                 max_restarts: int = 0, rdzv_id: str = "labkit", fork_workers: bool = True) -> list[str]:
    """The ``labkit launch`` command line node ``node`` runs to join the job (ranks forked from torchrun's agent:
    one torch import per node instead of one per rank)."""
    return [sys.executable, "-m", "labkit", "launch", "--nnodes", str(nnodes), "--node-rank", str(node),
            "--nproc-per-node", str(nproc_per_node), "--rdzv-endpoint", f"{node_address(0)}:{RDZV_PORT}",
            "--rdzv-id", rdzv_id, "--local-addr", node_address(node), "--max-restarts", str(max_restarts),
            "--timeout", f"{timeout_s:g}", *(["--fork-workers"] if fork_workers else []), target]


def job_env(node: int, result_dir: Path, params: dict[str, Any], threads: int = 1) -> dict[str, str]:
    """The environment of one node's launcher: this labkit importable, gloo on eth0, a fixed malloc mmap threshold
    (``RANK_MALLOC_ENV``), the job's parameters, and a temporary folder inside ``result_dir`` (torchrun's agent
    writes ``torchelastic_*`` folders and error files there and never deletes them; the job's folder goes, and they
    with it)."""
    tmp, marks = Path(result_dir) / f"tmp-node{node}", Path(result_dir) / RANK_MARKS
    for folder in (tmp, marks):
        folder.mkdir(exist_ok=True)
        os.chmod(folder, 0o1777)              # ranks in a user namespace write here too
    env = dict(os.environ)
    paths = [p or os.getcwd() for p in sys.path]
    env.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)), GLOO_SOCKET_IFNAME="eth0",
               OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", LABKIT_NODE_ADDR=node_address(node),
               LABKIT_RESULT_DIR=str(result_dir), LABKIT_JOB=json.dumps(params),
               TORCH_CPP_LOG_LEVEL="ERROR", LOGLEVEL="WARNING", TMPDIR=str(tmp), LABKIT_RANK_MARKS=str(marks))
    for stale in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(stale, None)
    for name, value in RANK_MALLOC_ENV.items():
        env.setdefault(name, value)                # a user's own malloc setting wins
    return env


def run_job(nodes: EmulatedNodes, target: str, nproc_per_node: int = 2, params: dict[str, Any] | None = None, *,
            timeout_s: float = 60.0, max_restarts: int = 0,
            while_running: Callable[[list[subprocess.Popen], Path], None] | None = None,
            result_dir: Path | None = None) -> JobResult:
    """Run ``target`` ('package.module:function') on every rank of every node; each rank's reported result.

    ``while_running(procs, result_dir)`` is called once the nodes' launchers are started (the failure lesson
    kills a node from there). Raises JobFailed (with the failing node's output) or TimeoutError. ``result_dir``:
    the folder the ranks report to, owned by the caller (it reads what they reported before a stop); default a
    temporary one.
    """
    positive_int(nproc_per_node, "nproc_per_node")
    positive_number(timeout_s, "timeout_s")
    nnodes = nodes.config.nodes
    with contextlib.ExitStack() as owned:
        run_dir = result_dir or Path(owned.enter_context(tempfile.TemporaryDirectory(prefix="labkit-nodes-")))
        os.chmod(run_dir, 0o777)          # ranks in a user namespace write here too
        start, procs, logs = now_s(), [], []
        try:
            for node in range(nnodes):
                logs.append(open(run_dir / f"node{node}.log", "wb"))
                # each node's own timeout is longer than the job's, so the runner's timeout reports it
                argv = node_command(target, node, nnodes, nproc_per_node, timeout_s + 20, max_restarts)
                procs.append(nodes.popen(node, argv, stdout=logs[-1], stderr=subprocess.STDOUT,
                                         env=job_env(node, run_dir, params or {})))
            if while_running is not None:
                while_running(procs, run_dir)
            watch = watch_job(nodes, procs, timeout_s, run_dir / RANK_MARKS, started_s=start)
        finally:
            for log in logs:
                log.close()
            nodes.kill_all()                    # a worker that outlived its launcher goes too
            for proc in procs:                  # and the launchers the first fault left running are reaped
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        wall_s = now_s() - start
        outputs = [(run_dir / f"node{k}.log").read_text(errors="replace") for k in range(nnodes)]
        _raise_for(watch, outputs, target, timeout_s)
        results = _read_results(run_dir, nnodes * nproc_per_node, target)
    return JobResult(results, outputs, wall_s)


def _raise_for(watch: JobWatch, outputs: list[str], target: str, timeout_s: float) -> None:
    """The first fault, named where it happened (labkit.cluster.faults); else a timeout naming the nodes still up."""
    if watch.fault is not None:
        raise JobFailed(fault_message(target, watch, outputs))
    running = [node for node, code in enumerate(watch.codes) if code is None]
    if running and watch.frozen:
        where = {r: n for n, ranks in watch.ranks.items() for r in ranks}
        names = ", ".join(f"rank {r}" + (f" (node {where[r]})" if r in where else "") for r in watch.frozen)
        node = where.get(watch.frozen[0], running[0])
        raise TimeoutError(f"{target}: {names} stopped answering within the {timeout_s:g} s timeout: the process was "
                           "frozen (state T: stopped by SIGSTOP, Ctrl-Z or a debugger), not running, and the other "
                           f"ranks waited for it; every process on every node was killed. Node {node}'s last lines:\n"
                           f"{_tail(outputs[node]) or '(nothing printed)'}")
    if running:
        node = running[0]
        raise TimeoutError(f"{target}: node{'s' if len(running) > 1 else ''} {', '.join(map(str, running))} did not "
                           f"finish within {timeout_s:g} s (no node failed and every link was up); every process on "
                           f"every node was killed. Node {node}'s last lines:\n{_tail(outputs[node]) or '(nothing printed)'}")


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _read_results(run_dir: Path, world_size: int, target: str) -> list[dict[str, Any]]:
    results = []
    for rank in range(world_size):
        path = run_dir / f"rank{rank}.json"
        if not path.exists():
            raise JobFailed(f"{target}: rank {rank} reported no result (it must call labkit.cluster.rankside.report)")
        results.append(json.loads(path.read_text()))
    return results
