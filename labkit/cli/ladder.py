"""`labkit ladder`: the tuning ladder of notebook 10 headless (the only ladder command line).

Every option is checked before the first rung runs (a ladder takes minutes; a bad --out must not lose them):
--out must be a writable directory, --ddp-world-size at most what this machine can run, --target an accuracy.
Then every rung is timed to the target accuracy (notebook 10's section 7; --no-to-target leaves it out) and the
rung that reaches it first is named. Writes ladder.json and ladder.md to --out and prints the table (or the JSON).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.cli.common import add_output_flags, device_name, int_list, positive_int_arg, subparser
from labkit.core.choices import MODELS
from labkit.core.envcheck import writable_place_problem
from labkit.core.results import ResultStream, StoppedEarly, keep_finished
from labkit.core.rundirs import RUN_DIR_ENV_VAR, run_path
from labkit.ladder.rungs import RUNG_KEYS

if TYPE_CHECKING:
    from labkit.ladder.config import LadderConfig
    from labkit.ladder.first_to_target import TargetPlan


def accuracy_arg(text: str) -> float:
    """argparse type: a target accuracy as a fraction strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an accuracy such as 0.9, got {text!r}") from None
    if not math.isfinite(value) or not 0 < value < 1:
        hint = f" (a fraction: {value / 100:g} for {text}%)" if math.isfinite(value) and 1 < value < 100 else ""
        raise argparse.ArgumentTypeError(f"expected an accuracy between 0 and 1{hint}, got {text!r}")
    return value


def checked_out_dir(text: str, typed: bool = True) -> Path:
    """``--out`` as a directory that is, or can be created, writable; one clear ValueError otherwise.

    Nothing is created here (a usage error found later must not leave an empty folder); ``typed`` False means
    the default under $LABKIT_RUN_DIR (or runs/), and the message blames that, not --out.
    """
    path = Path(text).expanduser()
    where = f"--out {text}" if typed else f"the default output folder {text} (from {RUN_DIR_ENV_VAR} or runs/)"
    if path.exists() and not path.is_dir():
        raise ValueError(f"{where} is a file, not a directory; give a directory for ladder.json and "
                         "ladder.md, e.g. --out runs/ladder")
    why = writable_place_problem(path)
    if why:                                 # a bad --out is a usage error (exit 2), found before any work
        raise ValueError(f"{where} {why}; pass an --out you can write to, e.g. --out runs/ladder")
    return path


def max_ddp_world_size(device: str | None) -> tuple[int, str]:
    """(most processes the DDP rung may start here, why): one per GPU on a GPU, gloo's per-core limit on a CPU."""
    import torch

    from labkit.comm.backend import world_size_limit
    from labkit.core.device import get_device

    if get_device(device).type == "cuda":
        gpus = torch.cuda.device_count()
        return gpus, f"NCCL runs one process per GPU and this machine has {gpus}"
    return world_size_limit("gloo")


def config_from_args(args: argparse.Namespace) -> LadderConfig:
    """The LadderConfig the options describe (mode preset plus the options given)."""
    from labkit.ladder.config import LadderConfig

    overrides = {k: v for k, v in {
        "model": args.model, "dataset": args.dataset, "train_limit": args.train_limit,
        "budget_epochs": args.budget_epochs, "device": args.device, "ddp_world_size": args.ddp_world_size,
        "batch_candidates": tuple(args.batch_sizes) if args.batch_sizes else None,
        "skip": tuple(args.skip) if args.skip else None}.items() if v is not None}
    return dataclasses.replace(LadderConfig.for_mode(**overrides), progress=not args.no_progress)


def check_args(args: argparse.Namespace) -> tuple[Path, LadderConfig]:
    """Every check that can fail, before the first rung: returns (out dir, config) or raises one ValueError."""
    from labkit.core.validation import positive_int as checked_positive

    if args.ddp_world_size is not None:
        limit, why = max_ddp_world_size(args.device)
        if args.ddp_world_size > limit:
            checked_positive(args.ddp_world_size, "--ddp-world-size", maximum=max(limit, 1), hint=why)
    config = config_from_args(args)
    return checked_out_dir(args.out or str(run_path("ladder")), typed=args.out is not None), config


def target_plan(args: argparse.Namespace) -> TargetPlan | None:
    """How the rungs are timed to the target (this mode's plan, --target's accuracy), or None with --no-to-target."""
    from labkit.ladder.first_to_target import TargetPlan

    if not args.to_target:
        if args.target is not None:
            raise ValueError("--target needs the rungs timed to it: drop --no-to-target, or drop --target")
        return None
    return TargetPlan.for_mode(target=args.target)


def run(args: argparse.Namespace) -> int:
    """Check the options, climb the ladder, time its rungs to the target, save it, print the table or the JSON."""
    from labkit.ladder.climb import run_ladder

    out, config = check_args(args)
    plan = target_plan(args)
    stream = ResultStream(out / "ladder.jsonl", len(RUNG_KEYS), "rungs")
    earlier = [path.name for path in (out / "ladder.json", out / "ladder.md") if path.exists()]

    def on_rung(row: object) -> None:
        stream.add(row, to_json=dataclasses.asdict)
        if len(stream.rows) == stream.total:
            stream.phase = "the hardware ceiling"       # every rung is in; the ceiling is measured next

    try:
        with keep_finished(stream, lambda rows: print(partial_table(rows))):
            result = run_ladder(config, on_rung=on_rung, to_target=plan,
                                on_phase=lambda phase: setattr(stream, "phase", phase))
    except StoppedEarly as stop:        # an earlier run's report beside this run's rungs must not pass for them
        raise StoppedEarly(f"{stop}; {' and '.join(earlier)} there {'are' if len(earlier) > 1 else 'is'} from an "
                           "earlier run" if earlier else str(stop), stop.code) from None
    json_path, md_path = result.save(out)
    if args.json:
        print(result.to_json())
    else:
        print(result.to_markdown())
        print(f"\nwrote {json_path} and {md_path}")
    return 0


def partial_table(rows: list) -> str:
    """The rungs that finished before an interrupt, as a short table."""
    from labkit.cli.common import fmt, format_table

    return format_table([dataclasses.asdict(r) for r in rows], [
        ("rung", "rung", str), ("title", "rung", str), ("samples_per_s", "samples/s", fmt(".1f")),
        ("val_accuracy", "val acc", fmt(".1%")), ("status", "status", str)], title="rungs finished")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `ladder`."""
    p = subparser(sub, "ladder", help="climb the tuning ladder: every speed-up rung measured on one job",
                  description="Train one job with the kit's speed-ups switched on rung by rung (batch size, data "
                              "loading, data on the device, TF32, mixed precision, channels-last, compile, DDP), "
                              "each measured for the same budget of samples and judged against rung 0's accuracy; "
                              "keep the rungs that help; then every rung is timed to a target accuracy and the rung "
                              "that reaches it first is named. Writes ladder.json and ladder.md (notebook 10).",
                  examples=["labkit ladder",
                            "labkit ladder --model small_cnn --budget-epochs 1 --skip compile ddp",
                            "labkit ladder --train-limit 256 --batch-sizes 16,32 --out runs/ladder-small",
                            "labkit ladder --target 0.9 --out runs/ladder-90",
                            "labkit ladder --no-to-target",
                            "labkit ladder --device cuda --json"])
    p.add_argument("--out", default=None, help="directory for ladder.json, ladder.md and ladder.jsonl (each rung "
                   "as it finishes; default: runs/ladder at the repository root, or under $LABKIT_RUN_DIR)")
    p.add_argument("--model", choices=MODELS, help="model (default: small_cnn in fast mode, resnet18 in full)")
    p.add_argument("--dataset", choices=("auto", "cifar10", "digits", "synthetic"),
                   help="dataset for labkit.core.data.load_data (default: auto)")
    p.add_argument("--train-limit", type=positive_int_arg, help="use at most this many training images")
    p.add_argument("--budget-epochs", type=int, help="fixed training budget per rung, in epochs")
    p.add_argument("--batch-sizes", type=int_list, help="rung 1's candidate batch sizes, comma-separated: 16,32,64")
    p.add_argument("--skip", nargs="+", choices=RUNG_KEYS[1:], help="rungs to leave out")
    p.add_argument("--ddp-world-size", type=positive_int_arg,
                   help="processes for the DDP rung (default: one per GPU, or 2 gloo processes on a CPU)")
    p.add_argument("--device", type=device_name, help="cpu, cuda or cuda:N (default: the first GPU, else the CPU)")
    p.add_argument("--to-target", action=argparse.BooleanOptionalAction, default=True,
                   help="time every single-process rung to the target accuracy and name the first to reach it "
                        "(default: on; fast mode: 85%%, 3 seeds, at most 4 epochs, 34 s measured on two cores; "
                        "full mode: rung 0's accuracy less the tolerance, 5 seeds, at most 20 epochs)")
    p.add_argument("--target", type=accuracy_arg, metavar="ACCURACY",
                   help="the target validation accuracy, e.g. 0.9 (default: the mode's, see --to-target)")
    add_output_flags(p)
    p.set_defaults(func=run)
