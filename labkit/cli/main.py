"""`labkit SUBCOMMAND`: the lab's measurements from the terminal.

Each subcommand calls the same `labkit` functions as the notebooks; usage errors exit with 2.
Run `labkit SUBCOMMAND --help` for a subcommand's options and examples. `labkit` is the console command
the install puts in the venv (`.venv/bin/labkit`, or plain `labkit` once the venv is activated);
`python -m labkit` is the same program.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# Subcommands that live in their own modules; each has `add_parser(subparsers)`.
SUBCOMMAND_MODULES = ("labkit.cli.doctor", "labkit.cli.sweep", "labkit.cli.profile", "labkit.cli.memory",
                      "labkit.cli.bench", "labkit.cli.simulate", "labkit.cli.ladder", "labkit.cli.launch",
                      "labkit.cli.roofline")
EXAMPLES = """examples (`.venv/bin/labkit` without an activated venv; `python -m labkit` is the same program):
  labkit doctor
  labkit sweep --model small_cnn --batch-sizes 16,32,64
  labkit profile --batch-size 64 --active 3
  labkit roofline --model transformer --top 15
  labkit allreduce-bench --world-size 2 --sizes 1K,64K,1M
  labkit simulate --algorithm ring --world-size 4 --size 1M
  labkit ladder --budget-epochs 1 --skip compile ddp
  labkit launch --world-size 2 labkit.comm.demos:all_reduce_sum"""


def build_parser() -> argparse.ArgumentParser:
    """The `labkit` parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def _failure_types() -> tuple[type[BaseException], ...]:
    """Errors that mean 'the measurement could not run here' (exit 1, one line), not a bug in the kit."""
    from labkit.comm.launch import LaunchError
    from labkit.core.data import DataUnavailableError

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
