"""`labkit allreduce-bench`: a real all-reduce over N processes (gloo or NCCL), nccl-tests layout.

Calls `labkit.comm.bench.allreduce_benchmark` and `format_nccl_tests_table`, the same functions notebook 06
uses. Flags follow nccl-tests' all_reduce_perf: -b/-e/-f (sizes), -n (iterations), -w (warm-up).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading

from labkit.cli.common import (add_results_flag, byte_list, nonnegative_int_arg, parse_bytes, positive_float, positive_int_arg,
                               print_json, results_file, subparser)
from labkit.core.choices import BACKENDS, COMM_DTYPES
from labkit.core.clock import now_s
from labkit.core.progress import progress_bar
from labkit.core.results import ResultStream, WriteError, atomic_write_text, keep_finished

MAX_SIZES = 64


def sizes_from_args(args: argparse.Namespace) -> list[int]:
    """The message sizes: --sizes as given, else min..max multiplying by the step factor (like nccl-tests)."""
    if args.sizes:
        return args.sizes
    if args.max_bytes < args.min_bytes:
        raise ValueError(f"--max-bytes ({args.max_bytes}) must be >= --min-bytes ({args.min_bytes})")
    if args.step_factor < 2 and args.min_bytes != args.max_bytes:
        raise ValueError(f"--step-factor must be >= 2 to grow the size, got {args.step_factor}")
    sizes, size = [], args.min_bytes
    while size <= args.max_bytes and len(sizes) <= MAX_SIZES:
        sizes.append(size)
        size *= args.step_factor
    if len(sizes) > MAX_SIZES:
        raise ValueError(f"that is more than {MAX_SIZES} message sizes; raise --step-factor or narrow the range")
    return sizes


class ElapsedBar:
    """A progress line on stderr that ticks every half second while a single blocking call runs."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self.bar = progress_bar(total=None, desc=desc, unit="s", enabled=enabled,
                                bar_format="{desc}: {elapsed} elapsed")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        while not self.stop.wait(0.5):
            self.bar.refresh()

    def __enter__(self) -> "ElapsedBar":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.bar.close()


def run(args: argparse.Namespace) -> int:
    """Check everything before any process starts, benchmark, and print the nccl-tests table (or JSON)."""
    from labkit.comm.backend import check_world_size, choose_backend, world_size_limit
    from labkit.comm.bench import allreduce_benchmark, check_memory, check_sizes, format_nccl_tests_table
    from labkit.comm.launch import LaunchError

    sizes = check_sizes(sizes_from_args(args), args.dtype)
    backend = choose_backend(args.world_size, args.backend).backend
    check_world_size(args.world_size, world_size_limit(backend))
    check_memory(args.world_size, max(sizes), backend)
    stream = ResultStream(results_file(args.results, "allreduce-bench", "rows.jsonl"), len(sizes), "message sizes")
    if stream.path.exists():
        stream.path.unlink()      # rows of an earlier run must not pass for this one's
    desc = f"all_reduce on {args.world_size} ranks ({backend}), {len(sizes)} sizes"
    start_s = now_s()
    with keep_finished(stream, lambda rows: show_rows(rows, args.json), failures=(LaunchError,)), \
            ElapsedBar(desc, enabled=not args.no_progress):
        try:
            rows = allreduce_benchmark(args.world_size, sizes, backend=backend, iters=args.iters, warmup=args.warmup,
                                       dtype=args.dtype, timeout_s=args.timeout_s, rows_path=str(stream.path))
        except BaseException:
            stream.reload()       # the rows rank 0 saved before the timeout or interrupt
            raise
    wall_s = now_s() - start_s
    wrong = sum(r.wrong for r in rows)
    if args.json:
        print_json({"world_size": args.world_size, "rows": rows, "wall_s": wall_s, "wrong": wrong})
    else:
        print(format_nccl_tests_table(rows))
        print(summary_lines(rows, wall_s))
    sys.stdout.flush()
    try:
        atomic_write_text(stream.path, "".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows))  # all rows
    except WriteError as err:       # the table is out; say how much of it the file holds
        stream.reload()
        held = f"it holds the first {len(stream.rows)} of {len(rows)}" if stream.rows else f"none of the {len(rows)}"
        raise WriteError(f"{err}; {held} message sizes printed above") from None
    return 0 if wrong == 0 else 1


def show_rows(rows: list[dict], as_json: bool) -> None:
    """The rows that finished before a timeout or interrupt, in the same layout as a full run."""
    from labkit.comm.bench import BenchRow, format_nccl_tests_table

    if as_json:
        print_json({"rows": rows, "complete": False})
    else:
        print(format_nccl_tests_table([BenchRow(**row) for row in rows]))


def summary_lines(rows: list, wall_s: float) -> str:
    """nccl-tests' two closing lines (wrong elements, average busbw), then the wall time."""
    wrong = sum(r.wrong for r in rows)
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    if rows:
        avg_busbw = sum(r.busbw_gb_s for r in rows) / len(rows)
        lines.append(f"# Avg bus bandwidth    : {avg_busbw:.3f} GB/s  (busbw = algbw x 2(n-1)/n; "
                     "nccl-tests doc/PERFORMANCE.md)")
    lines.append(f"# {len(rows)} sizes in {wall_s:.1f} s wall time, including process start-up")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `allreduce-bench`."""
    p = subparser(sub, "allreduce-bench", help="benchmark a real all-reduce (gloo/NCCL) by message size",
                  description="Time a real torch.distributed all_reduce across world-size processes for each "
                              "message size and print time, algbw and busbw in the nccl-tests layout. "
                              "Backend auto = NCCL with one GPU per rank, else gloo over loopback TCP.",
                  examples=["labkit allreduce-bench",
                            "labkit allreduce-bench --world-size 4 -b 8 -e 128M -f 2",
                            "labkit allreduce-bench --world-size 2 --sizes 1K,64K,1M -n 50 -w 5",
                            "labkit allreduce-bench --backend nccl --world-size 8 -b 1M -e 1G --json"])
    p.add_argument("--world-size", "-g", type=positive_int_arg, default=2, help="number of ranks (processes; default 2)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto = nccl if there is a GPU per rank, else gloo (default auto)")
    p.add_argument("--sizes", type=byte_list, default=None, help="explicit sizes per rank, e.g. 1K,64K,1M")
    p.add_argument("--min-bytes", "-b", type=parse_bytes, default=parse_bytes("16"), help="smallest size (default 16)")
    p.add_argument("--max-bytes", "-e", type=parse_bytes, default=parse_bytes("16M"), help="largest size (default 16M)")
    p.add_argument("--step-factor", "-f", type=positive_int_arg, default=4, help="size multiplier (default 4)")
    p.add_argument("--iters", "-n", type=positive_int_arg, default=20, help="timed all-reduces per size (default 20)")
    p.add_argument("--warmup", "-w", type=nonnegative_int_arg, default=5, help="untimed warm-up calls per size (default 5)")
    p.add_argument("--dtype", choices=tuple(COMM_DTYPES), default="float32", help="element type (default float32)")
    p.add_argument("--timeout-s", type=positive_float, default=300.0,
                   help="kill every rank after this many seconds (default 300)")
    add_results_flag(p, "runs/allreduce-bench/rows.jsonl")
    p.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="hide the elapsed-time line (shown on stderr)")
    p.set_defaults(func=run)
