"""`labkit launch`: run a module function on N processes joined in a torch.distributed group.

Run by hand, it starts the ranks itself with `labkit.comm.launch.launch` (the notebooks' launcher: a timeout,
output rank by rank, no orphaned processes) and prints each rank's result. Started by torchrun or mpiexec,
each copy is one rank: it joins the group the launcher describes (`labkit.comm.worker.init_from_env`), runs
the function and prints its result, so one command line scales from one CPU process to several nodes.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
from typing import TYPE_CHECKING, Any, Iterator

from labkit.cli.common import nonnegative_int_arg, positive_float, positive_int_arg, subparser
from labkit.comm.launch_env import detect_launcher_env
from labkit.core.results import ResultStream, keep_finished
from labkit.core.choices import BACKENDS

if TYPE_CHECKING:
    from labkit.comm.launch_nodes import NodeLaunch

DEFAULT_WORLD_SIZE = 2
# a forked worker still running at this fraction of --timeout prints its stacks, before the deadline stops it
STACK_DUMP_FRACTION = 0.9


def run(args: argparse.Namespace) -> int:
    """Under torchrun/mpiexec: be one rank of the launcher's group; otherwise start the ranks here."""
    if args.nnodes is not None:
        return _run_node(args)          # before importing torch: this process only waits for torchrun
    from labkit.comm.launch import RankFailedError, launch
    from labkit.comm.worker import print_rank_result, run_in_launcher_group

    place = detect_launcher_env()
    if place.launcher != "single":
        if args.world_size is not None and args.world_size != place.world_size:
            raise ValueError(f"--world-size {args.world_size} disagrees with the {place.world_size} ranks that "
                             f"{place.launcher} started; under a launcher, leave --world-size out")
        rank, world_size, result = run_in_launcher_group(args.target, args.backend, pg_timeout_s=args.timeout)
        print_rank_result(rank, world_size, args.target, result)
        return 0
    world_size = DEFAULT_WORLD_SIZE if args.world_size is None else args.world_size
    returned = ResultStream(None, world_size, "ranks returned")     # kept through a timeout, Ctrl-C or SIGTERM
    with keep_finished(returned, lambda rows: print("\n".join(f"rank {r}: {value!r}" for r, value in sorted(rows))),
                       failures=(RankFailedError,)):
        results = launch(args.target, world_size, backend=args.backend, timeout_s=args.timeout,
                         on_result=lambda rank, value: returned.add((rank, value)))
    for rank, result in enumerate(results):
        print(f"rank {rank}: {result!r}")
    return 0


def _run_node(args: argparse.Namespace) -> int:
    """This machine's part of a multi-node job: run torchrun with c10d rendezvous, under the timeout."""
    from labkit.comm.launch_nodes import NodeLaunch, run_torchrun, torchrun_nodes_command

    if args.node_rank is None or args.rdzv_endpoint is None:
        raise ValueError("--nnodes needs --node-rank (this node's number, 0..nnodes-1) and --rdzv-endpoint "
                         "(node 0's HOST:PORT), e.g. --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29400")
    node = NodeLaunch(args.nnodes, args.node_rank, args.nproc_per_node, args.rdzv_endpoint,
                      rdzv_id=args.rdzv_id, local_addr=args.local_addr, max_restarts=args.max_restarts)
    command = torchrun_nodes_command(args.target, node)
    if args.fork_workers:
        from labkit.comm.node_agent import run_forked_agent

        # torchrun's agent leaves torchelastic_* folders and error files in the temporary folder: give it one that goes
        with tempfile.TemporaryDirectory(prefix="labkit-torchrun-") as tmp, _temporary_folder(tmp), \
                _deadline(args.timeout, node):                     # this process is the agent
            run_forked_agent(command, dump_stacks_after_s=STACK_DUMP_FRACTION * args.timeout)
        return 0
    try:                                                         # Ctrl-C or SIGTERM: no worker outlives this node
        return run_torchrun(command, args.timeout, capture_output=False, threads_per_rank=None, grace_s=10).returncode
    except TimeoutError:
        raise TimeoutError(f"node {node.node_rank}'s torchrun did not finish within --timeout {args.timeout:g} s; "
                           "it was stopped (is every node started, and node 0's endpoint reachable?)") from None


@contextlib.contextmanager
def _temporary_folder(folder: str) -> Iterator[None]:
    """``folder`` as this process's temporary folder while inside, and the previous one after: a torch module
    imported later (torchvision's import creates torch's inductor cache folder) must not recreate a removed one."""
    before = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = folder
    try:
        yield
    finally:
        tempfile.tempdir = before[0]
        if before[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[1]


@contextlib.contextmanager
def _deadline(timeout_s: float, node: NodeLaunch) -> Iterator[None]:
    """TimeoutError in the agent's own (main) thread after ``timeout_s``: torchrun's agent then stops its forked
    workers as on any error (its ``run`` shuts them down in a ``finally``), waiting or not for a missing node."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"node {node.node_rank}'s torchrun agent did not finish within --timeout {timeout_s:g} s; "
                           "it was stopped (is every node started, and node 0's endpoint reachable?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)       # a forked worker does not inherit the timer
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `launch`."""
    p = subparser(sub, "launch", help="run a module function on N processes (torch.distributed, gloo or NCCL)",
                  description="Run package.module:function on --world-size processes joined in a torch.distributed "
                              "process group and print each rank's return value. Under torchrun or mpiexec every "
                              "copy is one rank of the launcher's group instead (export MASTER_ADDR and "
                              "MASTER_PORT for mpiexec). Backend auto = NCCL with one GPU per rank, else gloo.",
                  examples=["labkit launch labkit.comm.demos:all_reduce_sum",
                            "labkit launch --world-size 3 --timeout 60 labkit.comm.demos:collectives_demo",
                            "labkit launch --backend nccl --world-size 8 labkit.comm.demos:all_reduce_sum",
                            "torchrun --nproc-per-node=2 -m labkit launch labkit.comm.demos:all_reduce_sum",
                            "labkit launch --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-endpoint "
                            "10.0.0.1:29400 labkit.comm.demos:all_reduce_sum   # the same on node 1 with "
                            "--node-rank 1"])
    p.add_argument("target", help="the function to run, as package.module:function (called with no arguments)")
    p.add_argument("--world-size", type=int, default=None,
                   help=f"processes to start (default {DEFAULT_WORLD_SIZE}); under torchrun/mpiexec the launcher "
                        "decides, so leave it out")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto = nccl if there is a GPU per rank, else gloo (default auto)")
    p.add_argument("--timeout", type=positive_float, default=120.0,
                   help="seconds before every rank is killed; under a launcher, the collectives' timeout "
                        "(default 120)")
    nodes = p.add_argument_group("several machines (one torchrun per node, c10d rendezvous)")
    nodes.add_argument("--nnodes", type=positive_int_arg, default=None,
                       help="machines in the job; with it this command runs torchrun for this node")
    nodes.add_argument("--node-rank", type=nonnegative_int_arg, default=None,
                       help="this machine's name in the kit's messages, 0..nnodes-1 (0 on the endpoint's host). "
                            "With c10d rendezvous torchrun ignores it (and warns): the rendezvous numbers the nodes "
                            "itself (GROUP_RANK, nodes sorted by address), so RANK need not follow it")
    nodes.add_argument("--nproc-per-node", type=positive_int_arg, default=1, help="ranks on this machine (default 1)")
    nodes.add_argument("--rdzv-endpoint", default=None, help="node 0's HOST:PORT, where the nodes meet")
    nodes.add_argument("--rdzv-id", default="labkit", help="the job's name, the same on every node")
    nodes.add_argument("--local-addr", default=None, help="this machine's address the others can reach")
    nodes.add_argument("--max-restarts", type=nonnegative_int_arg, default=0,
                       help="times torchrun restarts the group after a failure (default 0)")
    nodes.add_argument("--fork-workers", action="store_true",
                       help="run torchrun's agent in this process and fork the ranks from it (they share torch's "
                            "memory: ~290 MB less per rank with the CUDA build); default: the torchrun command")
    p.set_defaults(func=run)
