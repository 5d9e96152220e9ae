"""torchrun, as a terminal runs it: the command line that starts ``labkit launch`` on every rank, and running it
(:func:`run_torchrun`, whose one home is the torch-free :mod:`labkit.comm.launch_nodes`).

``torchrun`` (``torch.distributed.run``) starts one agent per machine, which starts the ranks and gives each its
RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT; ``labkit launch`` reads them and joins the group, so the same
function runs from a cell (``labkit.comm.launch.launch``) or under torchrun.
"""
from __future__ import annotations

from labkit.comm.launch import free_port, target_name
from labkit.comm.launch_nodes import run_torchrun, torchrun_argv

__all__ = ["run_torchrun", "torchrun_command"]


def torchrun_command(target: str, nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None) -> list[str]:
    """The torchrun command line that runs ``target`` ('package.module:function') through ``labkit launch``."""
    target_name(target)
    return torchrun_argv(target, nnodes, nproc_per_node, node_rank, f"--master-addr={master_addr}",
                         f"--master-port={master_port or free_port()}")
