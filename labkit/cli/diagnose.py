"""`labkit diagnose`: run a training function on N ranks with the hang and drift instruments on, and print one
short report (which rank, which collective, which sequence id, the stuck rank's stack, drifted weights) instead
of every rank's logs. The instruments: the flight recorder, a short collective timeout, a stall watchdog per rank,
optionally TORCH_DISTRIBUTED_DEBUG=DETAIL (labkit.parallel.debug.diagnose); notebook 09b shows each on a real hang.
"""
from __future__ import annotations

import argparse

from labkit.cli.common import positive_float, positive_int_arg, subparser


def run(args: argparse.Namespace) -> int:
    """Run the target diagnosed; print the report; exit 0 if it finished with the ranks' weights equal, else 1."""
    from labkit.parallel.debug.diagnose import run_diagnosed

    report = run_diagnosed(args.target, args.world_size, pg_timeout_s=args.pg_timeout, timeout_s=args.timeout,
                           detail=args.detail)
    print(report.text(), flush=True)
    return 0 if report.ok and not report.drifted else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `diagnose`."""
    p = subparser(sub, "diagnose", help="run a training function on N ranks and say which rank hangs or drifts",
                  description="Run package.module:function (no arguments) on --world-size gloo ranks (NCCL with a "
                              "GPU per rank) with the flight recorder on and a short collective timeout; on a hang "
                              "print each rank's last collective, the first sequence id where the ranks part and "
                              "the stuck rank's stack. If the function returns its model, the ranks' weights are "
                              "compared at the end. Exit status 1 on a failure or drift. No process is left behind.",
                  examples=["labkit diagnose --world-size 3 labkit.parallel.debug.hang_exercises:uneven_shards_loop",
                            "labkit diagnose --world-size 3 --detail --pg-timeout 5 mytrain:main"])
    p.add_argument("target", help="the training function, as package.module:function (called with no arguments)")
    p.add_argument("--world-size", type=positive_int_arg, default=2, help="ranks to start (default 2)")
    p.add_argument("--pg-timeout", type=positive_float, default=10.0,
                   help="seconds a collective may wait before it raises (default 10)")
    p.add_argument("--timeout", type=positive_float, default=120.0,
                   help="seconds before every rank is killed (default 120)")
    p.add_argument("--detail", action="store_true",
                   help="also TORCH_DISTRIBUTED_DEBUG=DETAIL: op and shape checks before each collective")
    p.set_defaults(func=run)
