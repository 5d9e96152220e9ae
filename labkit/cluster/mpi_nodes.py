"""The MPI lane across emulated nodes: Hydra's ``mpiexec`` starts a proxy on every node without ssh.

Hydra (MPICH's launcher) starts its proxy on a remote host by running ``<launcher-exec> <host> <proxy command>``;
with ``-launcher ssh`` that program is ssh. Here it is a small script that enters the node owning that address
(the lab's namespaces, as :mod:`labkit.cluster.nodes` enters them) and runs the proxy there; ``mpiexec`` itself
runs on node 0. Every MPI process then lives in its node's network stack and its messages cross the shaped link.

Two settings matter only because these "nodes" share one kernel and ``/dev/shm``, which real nodes do not: MPICH
would otherwise move data between them through shared memory (its ch4 shm layer, or UCX's shm transports), and
nothing would cross the link. ``MPIR_CVAR_NOLOCAL=1`` makes MPICH treat every peer as remote, and
``MPIR_CVAR_CH4_NETMOD=ofi`` with ``FI_PROVIDER=tcp`` sends it over TCP sockets (libfabric's tcp provider).
On a real cluster leave all three unset.
"""
from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from labkit.cluster.nodes import EmulatedNodes, node_address
from labkit.comm.mpi import DemoRun, mpi_info, run_demo

SHARED_KERNEL_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def node_exec_script(nodes: EmulatedNodes, folder: Path) -> Path:
    """Write the launcher-exec program: ``node-exec [ssh options] HOST COMMAND`` runs COMMAND on HOST's node."""
    cases = " ".join(f'{node_address(k)}) ns=lkn{k};;' for k in range(nodes.config.nodes))
    enter = " ".join(shlex.quote(a) for a in nodes.enter_argv())
    script = Path(folder) / "node-exec"
    script.write_text("#!/bin/sh\n"
                      '# Hydra calls: node-exec [-x ...] HOST "COMMAND"; skip the options ssh would take\n'
                      'while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done\n'
                      'host="$1"; shift\n'
                      f'case "$host" in {cases} *) echo "node-exec: no emulated node has address $host" >&2; '
                      'exit 255;; esac\n'
                      f'exec {enter} ip netns exec "$ns" sh -c "$*"\n')
    script.chmod(0o755)
    return script


def mpiexec_args(nodes: EmulatedNodes, script: Path, ranks_per_node: int = 1) -> list[str]:
    """Hydra's options for one job over every node: the hosts, ranks per node, and the node-exec launcher."""
    hosts = ",".join(node_address(k) for k in range(nodes.config.nodes))
    return ["-launcher", "ssh", "-launcher-exec", str(script), "-hosts", hosts, "-ppn", str(ranks_per_node),
            "-n", str(ranks_per_node * nodes.config.nodes), "-iface", "eth0"]


def run_demo_on_nodes(nodes: EmulatedNodes, demo: str, *, ranks_per_node: int = 1, timeout_s: float = 60.0,
                      echo: bool = False, **kwargs: Any) -> DemoRun:
    """Run ``labkit.comm.mpi_demos <demo>`` with ``ranks_per_node`` MPI ranks on every emulated node."""
    info = mpi_info()
    if not info.available or info.mpiexec_flavor != "hydra":
        raise RuntimeError(f"the MPI lane across nodes needs MPICH's Hydra mpiexec: {info}")
    with tempfile.TemporaryDirectory(prefix="labkit-mpi-nodes-") as tmp:
        os.chmod(tmp, 0o755)
        script = node_exec_script(nodes, Path(tmp))
        try:
            return run_demo(demo, ranks_per_node * nodes.config.nodes, timeout_s=timeout_s, echo=echo,
                            env=SHARED_KERNEL_ENV, mpiexec_args=mpiexec_args(nodes, script, ranks_per_node),
                            wrap=lambda argv: nodes.node_argv(0, argv), oversubscribe=True, **kwargs)
        finally:
            nodes.kill_all()                 # a proxy that outlived mpiexec goes too


def shaped_link_rate(rows: Sequence[Mapping[str, Any]], sent_bytes: int, *, warmup: int, iters: int) -> float:
    """Frame bytes per second node 0's link carried during the bench's largest message: the frame bytes its eth0
    sent per byte reduced (counted over every call the bench made: per size one checked call, ``warmup`` and
    ``iters``; about 1.05 from TCP/IP and Ethernet headers), times that size, over its time per call. tbf shapes
    frames, so this is what to hold against the shaped rate. (The slope between two sizes' times is noisier: one
    slow small call once made it read 28 MB/s on a 25 MB/s link.)"""
    if not rows or sent_bytes <= 0:
        raise ValueError(f"shaped_link_rate needs the bench's rows and the bytes node 0 sent; got {len(rows)} rows, "
                         f"{sent_bytes} bytes: did the bench run on the nodes?")
    reduced = (1 + warmup + iters) * sum(int(r["size_bytes"]) for r in rows)
    largest = max(rows, key=lambda r: int(r["size_bytes"]))
    return sent_bytes / reduced * int(largest["size_bytes"]) / float(largest["time_s"])
