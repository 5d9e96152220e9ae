"""`python -m labkit ladder`: the tuning ladder headless, wired to what `labkit.ladder` exposes.

Options come from `labkit.ladder.add_ladder_arguments`; the run is `labkit.ladder.run_ladder`, the same
function notebook 09 uses. Writes ladder.json and ladder.md to --out and prints the table (or JSON).
"""
from __future__ import annotations

import argparse
import dataclasses

from labkit.cli_common import subparser


def run(args: argparse.Namespace) -> int:
    """Climb the ladder, save it, print the Markdown table or the JSON."""
    from labkit.ladder import LadderConfig, run_ladder

    config = dataclasses.replace(LadderConfig.from_args(args), progress=not args.no_progress)
    result = run_ladder(config)
    json_path, md_path = result.save(args.out)
    if args.json:
        print(result.to_json())
    else:
        print(result.to_markdown())
        print(f"\nwrote {json_path} and {md_path}")
    return 0


def add_parser(sub) -> None:
    """Register `ladder`."""
    from labkit.ladder import add_ladder_arguments

    p = subparser(sub, "ladder", help="climb the tuning ladder: every speed-up rung measured on one job",
                  description="Train one job with the kit's speed-ups switched on rung by rung (batch size, data "
                              "loading, channels-last, mixed precision, compile, DDP, ...), each measured for the "
                              "same budget of samples; keep the rungs that help. Writes ladder.json and ladder.md.",
                  examples=["python -m labkit ladder",
                            "python -m labkit ladder --model small_cnn --budget-epochs 1 --skip compile ddp",
                            "python -m labkit ladder --train-limit 256 --batch-sizes 16 32 --out runs/ladder-small",
                            "python -m labkit ladder --device cuda --json"])
    add_ladder_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.set_defaults(func=run)
