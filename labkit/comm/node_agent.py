"""torchrun's own agent, run in this process, with the workers forked from it (ranks share torch's memory).

``torchrun`` starts every worker as a new Python process that imports torch again: with the CUDA build that is
~290 MB of private memory per rank, too much for several nodes' ranks on a 2 GB Binder. torchrun's agent can also
fork its workers, but only for a Python function, which its command line cannot name. Here the command line that
:func:`labkit.comm.launch_nodes.torchrun_nodes_command` builds is parsed by torchrun's own parser
(``torch.distributed.run.get_args_parser``, ``config_from_args``) and handed to the same ``elastic_launch``
torchrun calls, with ``start_method="fork"``: the same c10d rendezvous, restarts and RANK/LOCAL_RANK/GROUP_RANK
variables, each worker a fork of this process running ``labkit launch``'s rank side.
"""
from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib
import signal
import sys

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, get_args_parser

from labkit.comm.worker import print_rank_result, run_in_launcher_group
from labkit.core.results import Terminated


def forked_rank(target: str, dump_stacks_after_s: float | None = None) -> None:
    """One worker: join the group the agent describes, run ``target``, print its result as ``labkit launch`` does.
    Still running after ``dump_stacks_after_s``, it writes every thread's Python stack to stderr (faulthandler's
    watchdog thread, which runs even while the main thread waits inside gloo): a hung rank names its call before the
    agent's deadline stops it."""
    torch.set_num_threads(1)
    if dump_stacks_after_s is not None:
        faulthandler.dump_traceback_later(dump_stacks_after_s, exit=False, file=sys.stderr)
    try:
        rank, world_size, result = run_in_launcher_group(target)
    finally:
        faulthandler.cancel_dump_traceback_later()
    print_rank_result(rank, world_size, target, result)


def run_forked_agent(torchrun_argv: list[str], dump_stacks_after_s: float | None = None) -> None:
    """Run the job ``torchrun_argv`` (a torchrun command line ending in ``-m labkit launch TARGET``) in this
    process's torchrun agent, workers forked; raises torch's ChildFailedError when the workers fail for good, and
    the kit's own interrupts (KeyboardInterrupt, Terminated) when the agent was told to stop by a signal. A worker
    still running ``dump_stacks_after_s`` after it started prints its stacks (:func:`forked_rank`)."""
    if torchrun_argv[-4:-1] != ["-m", "labkit", "launch"]:
        raise ValueError(f"expected a torchrun command ending in '-m labkit launch TARGET', got {torchrun_argv!r}")
    args = get_args_parser().parse_args(torchrun_argv[1:])
    args.start_method = "fork"
    config, _, cmd_args = config_from_args(args)
    target = cmd_args[-1]
    with contextlib.suppress(Exception):    # a failing import is reported by each rank, with its traceback
        importlib.import_module(target.partition(":")[0])   # imported once here, inherited by every fork
    gc.freeze()                             # keep the collector from writing to (and so copying) inherited pages
    try:
        elastic_launch(config, entrypoint=forked_rank)(target, dump_stacks_after_s)
    except SignalException as err:          # torch's agent turns SIGTERM/SIGINT into this while its workers run
        if err.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise Terminated() if err.sigval == signal.SIGTERM else SystemExit(128 + int(err.sigval)) from None
