"""`labkit sweep`: the batch-size sweep and the largest batch that fits, from the terminal.

Calls `labkit.training.batch_size.batch_size_sweep` and `labkit.training.finder.find_max_batch`, the same
functions notebook 02 uses. On a GPU the finder runs real steps until CUDA runs out of memory; on a CPU it
checks the memory model against a budget (default: the RAM available now). Beside every row: its hardware
ceiling (the same model and recipe on batches already on the device) and the fraction of it the row reached.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import psutil

from labkit.cli.common import (add_model_flags, add_output_flags, fmt, format_bytes, format_table, int_list,
                               jsonable, load_workload, nonnegative_int_arg, parse_bytes, positive_float, positive_int_arg,
                               print_json, results_file, subparser, add_results_flag)
from labkit.core.results import ResultStream, keep_finished

if TYPE_CHECKING:
    from torch import nn

    from labkit.core.data import ImageData


def margin(text: str) -> float:
    """argparse type: a fraction in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), e.g. 0.1 for 10%, got {text!r}")
    return value


def defaults() -> tuple[list[int], int]:
    """Batch sizes and steps per size by the kit's mode (fast on CPU, full on GPU)."""
    from labkit.core.env import pick

    return pick(fast=[16, 32, 64], full=[32, 64, 128, 256, 512]), pick(fast=8, full=50)


def cpu_budget_bytes() -> int:
    """The RAM available right now: the default memory budget for the CPU finder."""
    return int(psutil.virtual_memory().available)


def run_finder(args: argparse.Namespace, data: ImageData, model: nn.Module) -> dict:
    """find_max_batch on the chosen device; returns its result and the budget it used, for printing."""
    from labkit.core.device import get_device
    from labkit.core.env import pick
    from labkit.training.finder import find_max_batch

    dev = get_device(args.device)
    budget = args.memory_budget
    if budget is None and dev.type != "cuda":
        budget = cpu_budget_bytes()
    finder = find_max_batch(model, data.image_shape, num_classes=data.num_classes, device=dev,
                            memory_budget_bytes=budget, safety_margin=args.safety_margin, limit=args.limit,
                            timing_steps=pick(fast=0, full=2) if args.finder_timing_steps is None
                            else args.finder_timing_steps)
    source = "--memory-budget" if args.memory_budget else (
        "GPU memory" if dev.type == "cuda" else "RAM available now")
    return {"finder": finder, "budget_bytes": budget, "budget_source": source, "limit": args.limit,
            "train_samples": len(data.train), "dataset": data.name}


def ceiling_note(measured: bool) -> str:
    """What the ceiling columns are (or that they were skipped)."""
    from labkit.training.ceiling import CEILING_REPEATS

    if not measured:
        return "not measured (--no-ceiling)"
    return (f"the same model, recipe and steps on real batches already on the device (no loader, no copy), fastest "
            f"of {CEILING_REPEATS} runs; 'of ceiling' = samples/s / ceiling samples/s")


def run(args: argparse.Namespace) -> int:
    """Sweep, find the largest batch, print the table."""
    from labkit.core.env import get_mode
    from labkit.core.models import build_model
    from labkit.training.batch_size import batch_size_sweep

    sizes, steps = defaults()
    sizes, steps = args.batch_sizes or sizes, args.steps or steps
    data, model = load_workload(args)
    too_big = [b for b in sizes if b > len(data.train)]
    if too_big:
        raise ValueError(f"--batch-sizes {too_big} exceed the {data.name} training set ({len(data.train)} samples); "
                         f"use batch sizes up to {len(data.train)}")
    stream = ResultStream(results_file(args.results, "sweep", f"{args.model}.jsonl"), len(sizes), "batch sizes")
    show = (lambda rows: print_json({"rows": rows, "complete": False})) if args.json else (
        lambda rows: print(sweep_table(rows)))
    with keep_finished(stream, show, failures=(ValueError,)):     # e.g. a budget the finder refuses, after the rows
        result = batch_size_sweep(lambda: build_model(args.model, data.num_classes, data.image_shape), data, sizes,
                                  steps=steps, time_budget_s=args.time_budget_s, base_lr=args.lr,
                                  base_batch=args.base_batch, lr_scaling=args.lr_scaling,
                                  memory_budget_bytes=args.memory_budget, device=args.device, seed=args.seed,
                                  progress=not args.no_progress, ceiling=not args.no_ceiling,
                                  on_row=lambda row: stream.add(row, to_json=jsonable))
        stream.phase = "the largest-batch search"
        found = None if args.no_find_max else run_finder(args, data, model)
    if args.json:
        print_json({"model": args.model, "dataset": data.name, "device": result.device, "mode": get_mode().name,
                    "steps_per_size": steps, "ceiling": ceiling_note(not args.no_ceiling),
                    "rows": result.rows, "knee_batch": result.knee(),
                    "max_batch": None if found is None else found["finder"].max_batch,
                    "finder": found, "results_file": stream.path})
        return 0
    print(f"Batch-size sweep: {args.model} on {data.name}, {steps} steps per size, device {result.device}, "
          f"{get_mode().name} mode\n")
    print(sweep_table(result.rows))
    print(f"\nceiling: {ceiling_note(not args.no_ceiling)}\nrows saved as they finished: {stream.path}")
    knee = result.knee()
    if knee is not None:
        print(f"knee: batch {knee} already reaches 90% of the best throughput")
    if found is not None:
        print("\n" + format_finder(found))
    return 0


def sweep_table(rows: list) -> str:
    """The sweep's rows as a table (also the finished rows after an interrupt)."""
    return format_table([vars(r) for r in rows], [
        ("batch_size", "batch", str), ("lr", "lr", fmt(".4g")), ("samples_per_s", "samples/s", fmt(".1f")),
        ("ceiling_samples_per_s", "ceiling samples/s", fmt(".1f")), ("fraction_of_ceiling", "of ceiling", fmt(".0%")),
        ("step_time_s", "step ms", lambda s: fmt(".2f")(None if s is None else s * 1e3)),
        ("peak_mem_bytes", "peak memory", format_bytes),
        ("val_accuracy", "val acc %", lambda a: fmt(".1f")(None if a is None else 100 * a)),
        ("steps", "steps", str), ("note", "note", str)])


def format_finder(found: dict) -> str:
    """The finder's answer and its trials."""
    f = found["finder"]
    budget = "" if found["budget_bytes"] is None else (
        f" within {format_bytes(f.usable_bytes)} ({format_bytes(found['budget_bytes'])} {found['budget_source']}"
        " minus the safety margin)")
    answer = str(f.max_batch)
    if f.max_batch >= found["limit"]:
        answer = f"at least {f.max_batch} (the search stopped at --limit)"
    samples = found.get("train_samples")
    if samples and f.max_batch > samples:   # memory allows more than the data can fill
        answer += (f"; memory is not the limit here: the {found.get('dataset', 'training')} set has only {samples} "
                   f"samples, so every batch up to {samples} fits")
    head = f"largest batch that fits: {answer}{budget}; method {f.method}, device {f.device}"
    trials = format_table([vars(t) for t in f.trials], [
        ("batch_size", "batch", str), ("fits", "fits", lambda v: "yes" if v else "no"),
        ("samples_per_s", "samples/s", fmt(".1f")), ("peak_mem_bytes", "peak memory", format_bytes),
        ("note", "note", str)], title="finder trials (doubling, then binary search)")
    return head + "\n" + trials


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `sweep`."""
    p = subparser(sub, "sweep", help="batch-size sweep: throughput, step time, memory, accuracy; largest batch",
                  description="Train a fresh model for a few steps at each batch size and print throughput, step "
                              "time, peak memory and validation accuracy, then search for the largest batch that "
                              "fits (real steps until out of memory on a GPU; the memory model against a budget "
                              "on a CPU). Defaults follow the kit's mode: fast on CPU, full on GPU.",
                  examples=["labkit sweep",
                            "labkit sweep --model resnet18 --batch-sizes 32,64,128,256 --steps 50",
                            "labkit sweep --model mlp --dataset digits --lr-scaling --json",
                            "labkit sweep --device cpu --memory-budget 2G --no-find-max"])
    add_model_flags(p)
    p.add_argument("--batch-sizes", type=int_list, default=None,
                   help="comma-separated batch sizes (default: 16,32,64 fast / 32,...,512 full)")
    p.add_argument("--steps", type=positive_int_arg, default=None,
                   help="training steps per batch size (default 8 fast / 50 full)")
    p.add_argument("--time-budget-s", type=positive_float, default=None, help="stop each size after this many seconds")
    p.add_argument("--lr", type=positive_float, default=0.05, help="learning rate at --base-batch (default 0.05)")
    p.add_argument("--base-batch", type=positive_int_arg, default=32, help="batch size --lr is meant for (default 32)")
    p.add_argument("--lr-scaling", action="store_true",
                   help="scale the lr linearly with the batch, with warm-up (Goyal et al. 2017)")
    p.add_argument("--memory-budget", type=parse_bytes, default=None,
                   help="memory budget, e.g. 2G (default: GPU memory, or the RAM available now on a CPU)")
    p.add_argument("--safety-margin", type=margin, default=0.1, help="fraction of the budget kept free (default 0.1)")
    p.add_argument("--limit", type=positive_int_arg, default=4096, help="largest batch the finder tries (default 4096)")
    p.add_argument("--finder-timing-steps", type=nonnegative_int_arg, default=None,
                   help="timed steps per finder trial (default 0 fast / 2 full)")
    p.add_argument("--no-find-max", action="store_true", help="skip the search for the largest batch")
    p.add_argument("--no-ceiling", action="store_true",
                   help="skip the hardware ceiling (device-resident batches) measured beside every batch size")
    add_results_flag(p, "runs/sweep/MODEL.jsonl")
    add_output_flags(p)
    p.set_defaults(func=run)
