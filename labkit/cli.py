"""`python -m labkit SUBCOMMAND`: the lab's measurements from the terminal.

Each subcommand calls the same `labkit` functions as the notebooks; usage errors exit with 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Sequence


def cmd_doctor(args: argparse.Namespace) -> int:
    from labkit import doctor

    report = doctor.collect(check_network=not args.no_network)
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    else:
        print(doctor.format_report(report))
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("doctor", help="report versions, devices, mode and dataset",
                       description="Report versions, devices, the kit's mode and the dataset it will use.",
                       epilog="examples:\n  python -m labkit doctor\n  python -m labkit doctor --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-network", action="store_true", help="do not probe whether CIFAR-10 can be downloaded")
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
