"""On a real cluster: the Slurm batch script and the plain two-host recipe for the same job.

Slurm starts one task per node (``srun --ntasks-per-node=1``); each task runs ``labkit launch --nnodes`` (torchrun
with c10d rendezvous) with its node rank from ``SLURM_NODEID`` and the rendezvous at the first host of
``SLURM_JOB_NODELIST`` (``scontrol show hostnames``), as PyTorch's elastic docs and Slurm's sbatch/srun manuals
describe. Without Slurm the same command runs by hand on each host. Torch-free.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from labkit.core.validation import positive_int

RDZV_PORT = 29400


@dataclass(frozen=True)
class ClusterJob:
    """A multi-node job: what to run, on how many nodes and processes per node, for how long."""

    target: str
    nodes: int = 2
    procs_per_node: int = 1
    time_limit: str = "00:30:00"
    job_name: str = "labkit"
    gpus_per_node: int = 0
    env: tuple[tuple[str, str], ...] = ()     # exported before srun, e.g. (("GLOO_SOCKET_IFNAME", "eth0"),)
    fork_workers: bool = False                # labkit launch --fork-workers: one torch import per node, ranks forked

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", self.target):
            raise ValueError(f"target must read 'package.module:function', got {self.target!r}")
        positive_int(self.nodes, "nodes")
        positive_int(self.procs_per_node, "procs_per_node")
        if not re.fullmatch(r"(\d+-)?\d{1,2}:\d{2}:\d{2}", self.time_limit):
            raise ValueError(f"time_limit must read HH:MM:SS or D-HH:MM:SS, got {self.time_limit!r}")
        if not re.fullmatch(r"[\w\-]+", self.job_name):
            raise ValueError(f"job_name must be letters, digits, '-' or '_', got {self.job_name!r}")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node must be >= 0, got {self.gpus_per_node}")
        bad = [k for k, _ in self.env if not re.fullmatch(r"[A-Za-z_]\w*", k)]
        if bad:
            raise ValueError(f"env names must be shell variable names, got {bad}")


def _launch_line(job: ClusterJob, node_rank: str, endpoint: str, rdzv_id: str, local_addr: str | None = None) -> str:
    addr = f" --local-addr {local_addr}" if local_addr else ""
    fork = " --fork-workers" if job.fork_workers else ""
    return (f"labkit launch --nnodes {job.nodes} --node-rank {node_rank} --nproc-per-node {job.procs_per_node} "
            f"--rdzv-endpoint {endpoint} --rdzv-id {rdzv_id}{addr}{fork} {shlex.quote(job.target)}")


def slurm_script(job: ClusterJob) -> str:
    """An sbatch script: one srun task per node, each running torchrun (via labkit launch) with c10d rendezvous."""
    gpus = [f"#SBATCH --gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []
    # each task names its own node (SLURMD_NODENAME) as the address the other nodes reach it by
    launch = _launch_line(job, "$SLURM_NODEID", f"$HEAD:{RDZV_PORT}", "$SLURM_JOB_ID", "$SLURMD_NODENAME")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job.job_name}",
             f"#SBATCH --nodes={job.nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --cpus-per-task={max(1, job.procs_per_node)}",
             f"#SBATCH --time={job.time_limit}",
             *gpus,
             "set -euo pipefail",
             *(f"export {k}={shlex.quote(v)}" for k, v in job.env),
             "# node 0 hosts the rendezvous: the first host Slurm gave the job",
             'export HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             # single quotes: each task expands $SLURM_NODEID itself, on its own node
             f"srun --nodes={job.nodes} --ntasks-per-node=1 bash -c '{launch}'",
             ""]
    return "\n".join(lines)


def two_host_recipe(job: ClusterJob, head_host: str = "HOST0") -> str:
    """The same job by hand: the command each host runs, differing only in its node rank."""
    if not re.fullmatch(r"[\w.\-]+", head_host):
        raise ValueError(f"head_host must be a host name or address, got {head_host!r}")
    steps = [f"# on every host: the same code and venv; {head_host} must be reachable on port {RDZV_PORT}"]
    for node in range(job.nodes):
        where = "the head host" if node == 0 else f"host {node}"
        steps.append(f"# {where}:\n" + _launch_line(job, str(node), f"{head_host}:{RDZV_PORT}", job.job_name))
    return "\n".join(steps) + "\n"
