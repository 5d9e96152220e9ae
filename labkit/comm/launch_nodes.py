"""Launch as clusters launch: one ``torchrun`` per node, joined by c10d rendezvous at node 0's address.

On a cluster every node runs the same command, differing only in ``--node-rank`` (the kit's name for the node;
see below) and, where hostnames do not resolve to the address the others can reach, ``--local-addr``::

    torchrun --nnodes=2 --nproc-per-node=2 --node-rank=K --rdzv-backend=c10d --rdzv-endpoint=10.77.0.1:29400 \\
             --rdzv-id=job1 --local-addr=10.77.0.<K+1> -m labkit launch package.module:function

The c10d rendezvous is a TCP store hosted by the agent on the endpoint's host; every node's agent registers there,
and when the rendezvous completes the agents are sorted (address, then pid) and each node's GROUP_RANK is its place
in that order (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py): ``--node-rank`` is ignored, with a
warning, except under the static rendezvous. Each agent then starts its workers with RANK, LOCAL_RANK, GROUP_RANK
and WORLD_SIZE (torch.distributed.elastic docs, "torchrun"). ``--max-restarts`` lets the agents restart the whole
group when a worker dies. :func:`run_torchrun` is the one runner, for a cell (output captured) and for ``labkit launch --nnodes``
(output to the terminal). Torch-free: the CLI builds and runs the command without loading torch.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from labkit.comm.stop import stop_group
from labkit.core.results import sigterm_as_interrupt
from labkit.core.validation import checked_int, positive_int, positive_number

_ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """('host', port) from 'host:port'; one clear error otherwise."""
    match = _ENDPOINT.match(endpoint.strip()) if isinstance(endpoint, str) else None
    if not match or not 0 < int(match["port"]) < 65536:
        raise ValueError(f"--rdzv-endpoint must read HOST:PORT (node 0's address and a free port, e.g. "
                         f"10.77.0.1:29400), got {endpoint!r}")
    return match["host"], int(match["port"])


@dataclass(frozen=True)
class NodeLaunch:
    """One node's part of a multi-node job: how many nodes, which one this is, where they meet."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    rdzv_endpoint: str
    rdzv_id: str = "labkit"
    local_addr: str | None = None
    max_restarts: int = 0

    def __post_init__(self) -> None:
        positive_int(self.nnodes, "nnodes")
        checked_int(self.node_rank, "node_rank", minimum=0, maximum=self.nnodes - 1,
                    hint=f"nodes are numbered 0..{self.nnodes - 1}")
        positive_int(self.nproc_per_node, "nproc_per_node")
        parse_endpoint(self.rdzv_endpoint)
        checked_int(self.max_restarts, "max_restarts", minimum=0)
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", self.rdzv_id):
            raise ValueError(f"rdzv_id must be letters, digits, '-' or '_', got {self.rdzv_id!r}")

    @property
    def world_size(self) -> int:
        """Processes in the whole job."""
        return self.nnodes * self.nproc_per_node


def torchrun_argv(target: str, nnodes: int, nproc_per_node: int, node_rank: int, *options: str) -> list[str]:
    """The one torchrun command builder: this Python's torchrun, the job's shape, ``options``, then
    ``-m labkit launch target`` (:mod:`labkit.cli.launch` runs ``target`` on every rank)."""
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"target must read 'package.module:function', got {target!r}")
    nnodes = positive_int(nnodes, "nnodes")
    positive_int(nproc_per_node, "nproc_per_node")
    checked_int(node_rank, "node_rank", minimum=0, maximum=nnodes - 1, hint=f"nodes are numbered 0..{nnodes - 1}")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [torchrun, f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc_per_node}",
            *options, "-m", "labkit", "launch", target]


def torchrun_nodes_command(target: str, launch: NodeLaunch, *, monitor_interval_s: float = 0.5) -> list[str]:
    """The torchrun command line one node runs to join a c10d-rendezvous job that calls ``target`` on every rank."""
    options = ["--rdzv-backend=c10d", f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={launch.rdzv_id}",
               f"--max-restarts={launch.max_restarts}", f"--monitor-interval={monitor_interval_s:g}"]
    if launch.local_addr:
        options.append(f"--local-addr={launch.local_addr}")
        if launch.local_addr == parse_endpoint(launch.rdzv_endpoint)[0]:
            # torchrun hosts the store where the endpoint matches the machine's hostname; an address that the
            # hostname does not resolve to (a second interface, a namespace) must be told so, or no node hosts it
            options.append("--rdzv-conf=is_host=1")
    return torchrun_argv(target, launch.nnodes, launch.nproc_per_node, launch.node_rank, *options)


def run_torchrun(cmd: list[str], timeout_s: float = 180.0, *, capture_output: bool = True,
                 threads_per_rank: int | None = 1, grace_s: float = 5.0) -> subprocess.CompletedProcess:
    """Run a torchrun command line as a terminal would; its exit code, and its output when ``capture_output``.

    ``threads_per_rank`` sets each rank's OMP_NUM_THREADS (None: torchrun's own choice). A timeout, Ctrl-C or
    SIGTERM stops torchrun and every rank it started (SIGTERM, ``grace_s`` for torchrun to stop them itself, then
    SIGKILL), and torchrun's ``torchelastic_*`` log folders, which it never deletes, go to a temporary folder that
    is deleted afterwards.
    """
    positive_number(timeout_s, "timeout_s", hint="a number of seconds")
    pipe = subprocess.PIPE if capture_output else None
    with tempfile.TemporaryDirectory(prefix="labkit-torchrun-") as tmp, sigterm_as_interrupt():
        env = {**os.environ, "TMPDIR": tmp, **({"OMP_NUM_THREADS": str(threads_per_rank)} if threads_per_rank else {})}
        proc = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True, env=env)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s=grace_s)
            proc.communicate()
            raise TimeoutError(f"torchrun did not finish within timeout_s={timeout_s:g}; it and its ranks were "
                               "stopped") from None
        except BaseException:
            stop_group(proc, grace_s=grace_s)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
