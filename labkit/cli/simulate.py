"""`labkit simulate`: the simulated all-reduce, step by step, with bytes per worker and modelled time.

Calls `labkit.comm.collectives.allreduce` and `allreduce_cost`, the same functions notebook 06 uses, and checks
every worker's output against the exact reduction before printing anything.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from labkit.cli.common import (fmt, format_bytes, format_table, nonnegative_int_arg, parse_bytes, positive_float,
                               positive_int_arg, print_json, subparser)
from labkit.comm.collectives import ALGORITHMS, OPS, allreduce, allreduce_cost
from labkit.comm.exactness import AllreduceMismatch, check_allreduce
from labkit.core.validation import checked_int

MAX_SIMULATED_BYTES = 2**30   # every worker's array lives in this one process
MAX_WORLD_SIZE = 512
DTYPES = ("float32", "float64", "float16", "int32", "int64")


def _worker_arrays(world_size: int, elements: int, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return [rng.integers(-100, 100, elements).astype(dtype) for _ in range(world_size)]
    return [rng.standard_normal(elements).astype(dtype) for _ in range(world_size)]


def _check(args: argparse.Namespace) -> int:
    """Validate sizes together; return the element count per worker."""
    itemsize = np.dtype(args.dtype).itemsize
    checked_int(args.world_size, "--world-size", maximum=MAX_WORLD_SIZE,
                hint="the simulator holds every worker in this process; use allreduce_cost for larger world sizes")
    if args.size < itemsize:
        raise ValueError(f"--size {args.size} B is smaller than one {args.dtype} element ({itemsize} B)")
    if args.size % itemsize:
        raise ValueError(f"--size {args.size} B is not a whole number of {args.dtype} elements ({itemsize} B each)")
    if args.size * args.world_size > MAX_SIMULATED_BYTES:
        raise ValueError(f"--world-size x --size = {format_bytes(args.size * args.world_size)} exceeds "
                         f"{format_bytes(MAX_SIMULATED_BYTES)}: the simulator holds every worker's array in memory; "
                         "use a smaller --size (the modelled time scales linearly in size)")
    return args.size // itemsize


def simulate_one(algorithm: str, arrays: list[np.ndarray], args: argparse.Namespace) -> dict:
    """Run one algorithm, check it (identical bits on every rank; within its rounding bound), model its time."""
    alpha, beta = args.latency_us * 1e-6, 1.0 / (args.bandwidth_gbs * 1e9)
    result = allreduce(arrays, algorithm=algorithm, op=args.op)
    checked = check_allreduce(arrays, result.outputs, algorithm, args.op)
    modelled_s = result.simulated_time_s(alpha, beta)
    closed_s = allreduce_cost(algorithm, args.world_size, result.nbytes, alpha, beta, itemsize=result.itemsize)
    if not np.isclose(modelled_s, closed_s, rtol=1e-9, atol=0.0):
        raise RuntimeError(f"{algorithm}: the message log's time {modelled_s:g} s disagrees with the closed form "
                           f"{closed_s:g} s")
    return {"algorithm": algorithm, "steps": result.num_steps, "messages": len(result.steps),
            "bytes_sent_per_worker": result.bytes_sent, "max_bytes_sent": int(result.bytes_sent.max()),
            "max_bytes_sent_fraction": float(result.bytes_sent.max() / result.nbytes),
            "modelled_time_s": modelled_s, "closed_form_time_s": closed_s,
            **checked, "log": result.steps}


def run(args: argparse.Namespace) -> int:
    """Simulate, check and print."""
    elements = _check(args)
    algorithms = list(ALGORITHMS) if args.algorithm == "all" else [args.algorithm]
    if "halving_doubling" in algorithms and args.world_size & (args.world_size - 1):
        if args.algorithm != "all":
            raise ValueError(f"--algorithm halving_doubling needs a power-of-two --world-size, got {args.world_size}; "
                             "use ring or tree")
        algorithms.remove("halving_doubling")
    arrays = _worker_arrays(args.world_size, elements, args.dtype, args.seed)
    try:
        rows = [simulate_one(a, arrays, args) for a in algorithms]
    except (AllreduceMismatch, RuntimeError) as err:   # a wrong answer: say so, never print its numbers
        print(f"error: {err}", file=sys.stderr)
        return 1
    head = {"world_size": args.world_size, "nbytes_per_worker": elements * np.dtype(args.dtype).itemsize,
            "dtype": args.dtype, "op": args.op, "latency_s": args.latency_us * 1e-6,
            "bandwidth_bytes_per_s": args.bandwidth_gbs * 1e9}
    if args.json:
        print_json({**head, "results": [{**r, "log": [vars(s) for s in r["log"]][:args.show_steps]} for r in rows]})
        return 0
    print(f"Simulated all-reduce ({args.op}) of {format_bytes(head['nbytes_per_worker'])} per worker "
          f"({elements} x {args.dtype}) on {args.world_size} workers; alpha-beta model: latency "
          f"{args.latency_us:g} us per message, bandwidth {args.bandwidth_gbs:g} GB/s")
    print("checked: every worker holds the identical bits; each output is within the rounding bound of its summation "
          "order (gamma_d * sum|x|, d = additions on the longest path; Higham 2002, section 4.2); the step-by-step "
          "time equals the closed form\n")
    print(format_table(rows, [("algorithm", "algorithm", str), ("steps", "steps", str), ("messages", "messages", str),
                              ("max_bytes_sent", "max sent/worker", format_bytes),
                              ("max_bytes_sent_fraction", "sent/array", fmt(".3f")),
                              ("modelled_time_s", "modelled ms", lambda s: f"{s * 1e3:.4f}"),
                              ("max_abs_error", "max |error|", fmt(".3g")),
                              ("max_error_bound", "bound", fmt(".3g"))]))
    print("\n" + _per_worker_table(rows, args.world_size))
    for r in rows:
        if args.show_steps:
            print(f"\n{r['algorithm']}: " + _log_table(r["log"], args.show_steps))
    return 0


def _per_worker_table(rows: list[dict], world_size: int, limit: int = 16) -> str:
    shown = list(range(min(world_size, limit)))
    table = [{"worker": w, **{r["algorithm"]: int(r["bytes_sent_per_worker"][w]) for r in rows}} for w in shown]
    more = f" (first {limit} of {world_size} workers)" if world_size > limit else ""
    return format_table(table, [("worker", "worker", str)] + [(r["algorithm"], r["algorithm"], format_bytes)
                                                             for r in rows], title=f"bytes sent per worker{more}")


def _log_table(log: list, limit: int) -> str:
    shown = [{"step": s.step, "route": f"{s.sender} -> {s.receiver}", "nbytes": s.nbytes, "phase": s.phase,
              "chunk": "all" if s.chunk is None else f"{s.chunk}-{s.chunk + s.num_chunks - 1}" if s.num_chunks > 1
              else str(s.chunk)}
             for s in log[:limit]]
    more = f" (first {limit} of {len(log)})" if len(log) > limit else ""
    return format_table(shown, [("step", "step", str), ("route", "sender -> receiver", str), ("chunk", "chunk", str),
                                ("nbytes", "bytes", format_bytes), ("phase", "phase", str)], title=f"messages{more}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `simulate`."""
    p = subparser(sub, "simulate", help="simulate an all-reduce: steps, bytes per worker, modelled time",
                  description="Simulate an all-reduce of one array per worker in this process, check every output "
                              "against the exact reduction, and print the steps, bytes sent per worker and the "
                              "alpha-beta modelled time (Thakur, Rabenseifner & Gropp 2005).",
                  examples=["labkit simulate --algorithm ring --world-size 4 --size 1M",
                            "labkit simulate --algorithm all --world-size 8 --size 64M --no-steps",
                            "labkit simulate --algorithm tree --world-size 5 --size 4K --show-steps 50",
                            "labkit simulate --algorithm halving_doubling --world-size 16 --json"])
    p.add_argument("--algorithm", choices=(*ALGORITHMS, "all"), default="ring", help="algorithm, or all (default ring)")
    p.add_argument("--world-size", type=positive_int_arg, default=4, help="number of simulated workers R (default 4)")
    p.add_argument("--size", type=parse_bytes, default=parse_bytes("1M"),
                   help="bytes per worker, e.g. 4096, 64K, 1M (binary units; default 1M)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default float32)")
    p.add_argument("--op", choices=OPS, default="sum", help="reduction (default sum)")
    p.add_argument("--latency-us", type=positive_float, default=20.0,
                   help="alpha: seconds per message, in microseconds (illustrative default 20, as notebook 06)")
    p.add_argument("--bandwidth-gbs", type=positive_float, default=10.0,
                   help="1/beta: link bandwidth in GB/s (1e9 bytes/s; illustrative default 10)")
    p.add_argument("--show-steps", type=nonnegative_int_arg, default=24,
                   help="messages of the log to print (default 24; 0 = none)")
    p.add_argument("--no-steps", dest="show_steps", action="store_const", const=0, help="do not print the message log")
    p.add_argument("--seed", type=nonnegative_int_arg, default=0, help="seed of the random worker arrays (default 0)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)
