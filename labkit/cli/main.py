"""`python -m labkit SUBCOMMAND`: the lab's measurements from the terminal.

Each subcommand calls the same `labkit` functions as the notebooks; usage errors exit with 2.
Run `python -m labkit SUBCOMMAND --help` for a subcommand's options and examples.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import asdict
from typing import Sequence

# Subcommands that live in their own modules; each has `add_parser(subparsers)`.
SUBCOMMAND_MODULES = ("labkit.cli.sweep", "labkit.cli.profile", "labkit.cli.memory", "labkit.cli.bench",
                      "labkit.cli.simulate", "labkit.cli.ladder", "labkit.cli.launch")
EXAMPLES = """examples (`labkit ...` is the same command, installed into .venv/bin):
  python -m labkit doctor
  python -m labkit sweep --model small_cnn --batch-sizes 16,32,64
  python -m labkit profile --batch-size 64 --active 3
  python -m labkit allreduce-bench --world-size 2 --sizes 1K,64K,1M
  python -m labkit simulate --algorithm ring --world-size 4 --size 1M
  python -m labkit ladder --budget-epochs 1 --skip compile ddp
  python -m labkit launch --world-size 2 labkit.comm.demos:all_reduce_sum"""


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the doctor report (or JSON); exit 1 when a required package is missing."""
    from labkit.core import doctor

    report = doctor.collect(check_network=not args.no_network)
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    else:
        print(doctor.format_report(report))
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The `python -m labkit` parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("doctor", help="report versions, devices, mode and dataset",
                       description="Report versions, devices, the kit's mode and the dataset it will use.",
                       epilog="examples:\n  python -m labkit doctor\n  python -m labkit doctor --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-network", action="store_true", help="do not probe whether CIFAR-10 can be downloaded")
    p.set_defaults(func=cmd_doctor)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def _failure_types() -> tuple[type[BaseException], ...]:
    """Errors that mean 'the measurement could not run here' (exit 1, one line), not a bug in the kit."""
    from labkit.core.data import DataUnavailableError
    from labkit.comm.launch import LaunchError

    return DataUnavailableError, LaunchError, PermissionError, TimeoutError


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run the subcommand, and turn expected errors into one line and an exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except ValueError as err:  # bad arguments that argparse could not see: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        return 2
    except _failure_types() as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
