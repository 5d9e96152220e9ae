"""torchrun, as a terminal runs it: the command line that starts ``labkit launch`` on every rank, and running it
(:func:`run_torchrun`, whose one home is the torch-free :mod:`labkit.comm.launch_nodes`).

``torchrun`` (``torch.distributed.run``) starts one agent per machine, which starts the ranks and gives each its
RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT; ``labkit launch`` reads them and joins the group, so the same
function runs from a cell (``labkit.comm.launch.launch``) or under torchrun.

:func:`run_script_on_ranks` runs a training script a notebook wrote for torchrun (its ``if __name__ ==
"__main__"`` block sets up the group) under the kit's launcher instead: its function is called on ranks forked from
one process that already imported torch, with the launcher's timeout, and no agent process beside them.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from labkit.comm.launch import launch, target_name
from labkit.comm.ports import free_port
from labkit.comm.launch_nodes import run_torchrun, torchrun_argv

__all__ = ["run_script_on_ranks", "run_torchrun", "torchrun_command"]


def torchrun_command(target: str, nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None) -> list[str]:
    """The torchrun command line that runs ``target`` ('package.module:function') through ``labkit launch``.
    Run it inside ``with reserved_port() as port`` and pass ``master_port=port``: a port chosen here may be taken
    by another program before torchrun listens on it."""
    target_name(target)
    return torchrun_argv(target, nnodes, nproc_per_node, node_rank, f"--master-addr={master_addr}",
                         f"--master-port={master_port or free_port()}")


def run_script_on_ranks(script: str, function: str, world_size: int, *, module: str = "labkit_script",
                        timeout_s: float = 120.0) -> list[Any]:
    """Write ``script`` as ``<module>.py`` in a fresh temp folder and call its ``function`` on ``world_size`` ranks
    (the launcher sets up the group as torchrun would); each rank's return value, in rank order. The folder, the
    import path and the imported module are gone afterwards."""
    if not (module.isidentifier() and function.isidentifier()):
        raise ValueError(f"module {module!r} and function {function!r} must be Python names, e.g. 'shard_and_report'")
    with tempfile.TemporaryDirectory(prefix="labkit-script-") as folder:
        (Path(folder) / f"{module}.py").write_text(script)
        sys.path.insert(0, folder)                      # the ranks import the file as a module
        try:
            return launch(f"{module}:{function}", world_size, timeout_s=timeout_s)
        finally:
            sys.path.remove(folder)
            sys.modules.pop(module, None)
