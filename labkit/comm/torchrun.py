"""torchrun, as a terminal runs it: the command line that starts ``labkit launch`` on every rank, and running it.

``torchrun`` (``torch.distributed.run``) starts one agent per machine, which starts the ranks and gives each its
RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT; ``labkit launch`` reads them and joins the group, so the same
function runs from a cell (``labkit.comm.launch.launch``) or under torchrun.
"""
from __future__ import annotations

import os
import subprocess
import tempfile

from labkit.comm.launch import free_port, target_name
from labkit.comm.launch_nodes import torchrun_argv
from labkit.core.procs import kill_tree
from labkit.core.results import sigterm_as_interrupt
from labkit.core.validation import positive_number


def torchrun_command(target: str, nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None) -> list[str]:
    """The torchrun command line that runs ``target`` ('package.module:function') through ``labkit launch``."""
    target_name(target)
    return torchrun_argv(target, nnodes, nproc_per_node, node_rank, f"--master-addr={master_addr}",
                         f"--master-port={master_port or free_port()}")


def run_torchrun(cmd: list[str], timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    """Run a torchrun command line as a terminal would (one OpenMP thread per rank) and return its output.

    A timeout, Ctrl-C or SIGTERM stops torchrun and every rank it started, and torchrun's ``torchelastic_*`` log
    folders, which it never deletes, go to a temporary folder that is deleted afterwards.
    """
    positive_number(timeout_s, "timeout_s", hint="a number of seconds")
    with tempfile.TemporaryDirectory(prefix="labkit-torchrun-") as tmp, sigterm_as_interrupt():
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": tmp})
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid, grace_s=5.0)
            proc.communicate()
            raise TimeoutError(f"torchrun did not finish within timeout_s={timeout_s:g}; it and its ranks were "
                               "stopped") from None
        except BaseException:
            kill_tree(proc.pid, grace_s=5.0)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
