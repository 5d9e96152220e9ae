"""The rank side of a node job: where am I (rank, node, address), what was I asked, where do I report.

torchrun's agent gives every worker RANK, LOCAL_RANK, GROUP_RANK (the node's rank in the job), WORLD_SIZE and
LOCAL_WORLD_SIZE; :mod:`labkit.cluster.run` adds the node's address (``LABKIT_NODE_ADDR``), the job's parameters
(``LABKIT_JOB``, JSON) and the folder the results go to (``LABKIT_RESULT_DIR``). Torch-free.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from labkit.comm.launch_env import detect_launcher_env


@dataclass(frozen=True)
class Place:
    """This process's place in a multi-node job, as the launcher announced it."""

    rank: int
    local_rank: int
    group_rank: int
    world_size: int
    local_world_size: int
    node_addr: str

    def as_dict(self) -> dict[str, Any]:
        """Plain fields, for a JSON report."""
        return asdict(self)


def place() -> Place:
    """Read this worker's place from torchrun's variables (a clear error when not started by torchrun); the node's
    address is the lab's ``LABKIT_NODE_ADDR``, else this host's name (under Slurm, the node's name)."""
    missing = [v for v in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
               if v not in os.environ]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} unset: run this under torchrun (labkit launch --nnodes ...)")
    here = detect_launcher_env()          # the one reader of the launcher's variables (checked there)
    return Place(here.rank, here.local_rank, int(os.environ["GROUP_RANK"]), here.world_size,
                 int(here.local_world_size or 1), os.environ.get("LABKIT_NODE_ADDR") or socket.gethostname())


def address_is_local(addr: str) -> bool:
    """True when this process's network stack owns ``addr`` (it can bind a socket to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, 0))
        except OSError:
            return False
    return True


def job_params() -> dict[str, Any]:
    """The job's parameters (``LABKIT_JOB``, JSON), {} when none were given."""
    return json.loads(os.environ.get("LABKIT_JOB", "{}"))


def report(result: dict[str, Any], rank: int | None = None) -> dict[str, Any]:
    """Write this rank's result as JSON where the job runner collects it; returns it (``labkit launch`` prints it)."""
    rank = detect_launcher_env().rank if rank is None else rank
    folder = os.environ.get("LABKIT_RESULT_DIR")
    if folder:
        path = Path(folder) / f"rank{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, path)
    return result


def rate_key(rate_mbit_s: float | None) -> str:
    """How a link speed names its results in a report ('200', '2000'; 'as set' when the job did not re-shape)."""
    return "as set" if rate_mbit_s is None else f"{float(rate_mbit_s):g}"
