"""`labkit profile`: profile N training steps on a schedule and say where the time went.

Calls `labkit.profile.profiler.profile_training`, the same function notebook 03 uses; writes Chrome/Perfetto traces.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.cli.common import (add_model_flags, add_output_flags, fmt, format_bytes, format_table, load_workload,
                               nonnegative_int_arg, positive_int_arg, print_json, subparser)
from labkit.core.clock import timestamp_s
from labkit.core.progress import progress_bar
from labkit.core.envcheck import writable_place_problem
from labkit.core.results import ResultStream, keep_finished, missing_folders, remove_empty
from labkit.core.rundirs import RUN_DIR_ENV_VAR, run_path

if TYPE_CHECKING:
    from labkit.profile.summary import ProfileSummary

TRACE_VIEWER = "https://ui.perfetto.dev (drag the .json in) or chrome://tracing"


class CountedBatches:
    """A loader wrapper that ticks a progress bar once per batch handed out (re-iterable like the loader)."""

    def __init__(self, loader, bar) -> None:
        self.loader, self.bar = loader, bar

    def __iter__(self):
        for batch in self.loader:
            self.bar.update(1)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


def checked_run_dir(args: argparse.Namespace) -> Path:
    """--run-dir (default ``run_path("profile", <model>-b<batch>-<time>)``), created and proven writable.

    An unusable directory is a bad argument: one line and exit status 2, before any model is built.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(timestamp_s()))
    path = Path(args.run_dir or run_path("profile", f"{args.model}-b{args.batch_size}-{stamp}")).expanduser()
    why = writable_place_problem(path)       # checked, not created: a later usage error leaves no empty folder
    if why:
        where = f"--run-dir {args.run_dir}" if args.run_dir else f"the default trace folder {path} (under " \
            f"{RUN_DIR_ENV_VAR} or runs/)"
        raise ValueError(f"{where} {why}; pass a --run-dir you can write to, e.g. --run-dir runs/prof")
    return path


def run(args: argparse.Namespace) -> int:
    """Profile, print the summary table and where the traces are."""
    from labkit.core.data import make_loader
    from labkit.profile.profiler import profile_training
    from labkit.profile.schedule import ProfileSchedule

    sched = ProfileSchedule(args.wait, args.warmup, args.active, args.repeat)  # validates the schedule first
    steps = max(args.steps or 0, sched.steps_needed)
    if args.steps is not None and args.steps < sched.steps_needed:
        raise ValueError(f"--steps {args.steps} is fewer than the schedule needs: (wait + warmup + active) x repeat"
                         f" = {sched.steps_needed}; raise --steps or shrink the schedule")
    run_dir = checked_run_dir(args)   # a bad --run-dir fails before any work
    data, model = load_workload(args)
    loader = make_loader(data.train, args.batch_size, shuffle=True, drop_last=True, seed=args.seed)
    stream = ResultStream(run_dir / "traces.jsonl", args.repeat, "profiled cycles (traces)")
    created = missing_folders(run_dir)
    try:
        with progress_bar(total=steps, desc="profiling steps", unit="step", enabled=not args.no_progress) as bar, \
                keep_finished(stream, lambda paths: print("\n".join(f"trace: {p}" for p in paths))):
            summary = profile_training(model, CountedBatches(loader, bar), run_dir=run_dir, wait=args.wait,
                                       warmup=args.warmup, active=args.active, repeat=args.repeat, steps=steps,
                                       device=args.device, sync_every_step=args.sync_every_step,
                                       on_trace=lambda path: stream.add(str(path)))
    except BaseException:
        remove_empty(created)           # stopped before the first trace: no empty trace folder is left
        raise
    if args.json:
        print_json({"model": args.model, "dataset": data.name, "batch_size": args.batch_size,
                    "device": summary.device, "run_dir": summary.run_dir, "trace_files": summary.trace_files,
                    "profiled_steps": summary.profiled_steps, "step_numbers": summary.step_numbers,
                    "samples_per_step": summary.samples_per_step, "step_time_median_s": summary.step_time_median_s,
                    "category_s": summary.category_s, "shares": summary.shares(), "top_ops": summary.top_ops,
                    "peak_mem_bytes": summary.peak_mem_bytes, "item_calls_per_step": summary.item_calls_per_step})
    else:
        print(format_summary(summary, args, data.name))
    return 0


def on_gpu(summary: ProfileSummary) -> bool:
    """Whether the profiled steps ran on a CUDA device (so the trace has GPU kernel times)."""
    return "(cuda:" in str(summary.device)   # labkit.core.device.device_label writes 'NAME (cuda:N)' for a GPU


def format_summary(summary: ProfileSummary, args: argparse.Namespace, dataset: str) -> str:
    """The profile as readable text: headline, time by category, top operators, trace paths."""
    s = summary.schedule
    head = [f"Profiled {summary.profiled_steps} steps of {summary.samples_per_step} samples: {args.model} on "
            f"{dataset}, device {summary.device}",
            f"schedule: wait={s.wait} warmup={s.warmup} active={s.active} repeat={s.repeat}",
            f"median step {summary.step_time_median_s * 1e3:.2f} ms "
            f"({summary.step_time_median_s / max(summary.samples_per_step, 1) * 1e3:.3f} ms/sample); "
            f"peak memory {format_bytes(summary.peak_mem_bytes)}; .item() calls per step "
            f"{summary.item_calls_per_step:.1f}", ""]
    shares = summary.shares()
    cats = [{"category": c, "ms": t * 1e3, "share": 100 * shares[c]} for c, t in summary.category_s.items()]
    ops = [{**op, "self_cpu_ms": op["self_cpu_s"] * 1e3, "self_device_ms": op["self_device_s"] * 1e3}
           for op in summary.top_ops[:args.top]]
    op_columns = [("name", "operator", lambda n: str(n)[:48]), ("calls", "calls/step", fmt(".1f")),
                  ("self_cpu_ms", "self CPU ms/step", fmt(".3f"))]
    if on_gpu(summary):   # on a CPU run there is no device time: an all-zero GPU column would only mislead
        op_columns.append(("self_device_ms", "self GPU ms/step", fmt(".3f")))
    tables = [format_table(cats, [("category", "category", str), ("ms", "ms/step", fmt(".3f")),
                                  ("share", "share %", fmt(".1f"))], title="Time per profiled step by category"), "",
              format_table(ops, op_columns, title=f"Top {len(ops)} operators by self time"), ""]
    files = [f"trace: {p}" for p in summary.trace_files]
    return "\n".join(head + tables + files + [f"open the trace at {TRACE_VIEWER}"])


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `profile`."""
    p = subparser(sub, "profile", help="profile N training steps and write a trace",
                  description="Profile training steps with torch.profiler on a wait/warmup/active schedule, "
                              "print time by category and the top operators, and write Chrome/Perfetto traces.",
                  examples=["labkit profile",
                            "labkit profile --model resnet18 --batch-size 128 --active 5",
                            "labkit profile --wait 1 --warmup 1 --active 3 --repeat 2 --run-dir runs/prof",
                            "labkit profile --dataset synthetic --json"])
    add_model_flags(p)
    p.add_argument("--batch-size", type=positive_int_arg, default=32, help="samples per step (default 32)")
    p.add_argument("--wait", type=nonnegative_int_arg, default=1, help="steps skipped before tracing (default 1)")
    p.add_argument("--warmup", type=nonnegative_int_arg, default=1, help="steps traced then discarded (default 1)")
    p.add_argument("--active", type=positive_int_arg, default=3, help="steps recorded per cycle (default 3)")
    p.add_argument("--repeat", type=positive_int_arg, default=1, help="number of cycles (default 1)")
    p.add_argument("--steps", type=positive_int_arg, default=None,
                   help="training steps to run (default: exactly what the schedule needs)")
    p.add_argument("--run-dir", default=None,
                   help="trace directory (default <run root>/profile/<model>-b<batch>-<time>; the run root is "
                        "runs/ at the repository root, or $LABKIT_RUN_DIR)")
    p.add_argument("--sync-every-step", action="store_true", help="call loss.item() each step (shows the sync cost)")
    p.add_argument("--top", type=positive_int_arg, default=10, help="operators to list (default 10)")
    add_output_flags(p)
    p.set_defaults(func=run)
