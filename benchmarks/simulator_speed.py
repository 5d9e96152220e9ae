"""How fast is the simulated all-reduce? 64 workers x 1M float32 each, every algorithm (target: ring < 1 s).

    python benchmarks/simulator_speed.py [--world-size 64] [--length 1000000] [--repeats 3]
"""
from __future__ import annotations

import argparse

import numpy as np

from labkit.comm.collectives import ALGORITHMS, allreduce, reference_allreduce
from labkit.core.timing import time_fn


def main() -> None:
    """Time every algorithm on the same arrays, check the answer once, print median seconds."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world-size", type=int, default=64, help="simulated workers R")
    parser.add_argument("--length", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(args.length).astype(np.float32) for _ in range(args.world_size)]
    exact = reference_allreduce(arrays, "sum")
    print(f"simulated all-reduce, {args.world_size} workers x {args.length:,} float32 "
          f"({arrays[0].nbytes / 1e6:.1f} MB each)")
    for algorithm in ALGORITHMS:
        if algorithm == "halving_doubling" and args.world_size & (args.world_size - 1):
            continue
        result = allreduce(arrays, algorithm)
        assert all(np.allclose(out, exact, atol=1e-3) for out in result.outputs), algorithm
        timing = time_fn(lambda: allreduce(arrays, algorithm), warmup=0, repeats=args.repeats, device="cpu")
        print(f"  {algorithm:17s} {timing.median_s:6.3f} s median (p10 {timing.p10_s:.3f}, p90 {timing.p90_s:.3f}) "
              f"on {timing.device}; {result.num_steps} steps, {len(result.steps)} messages")


if __name__ == "__main__":
    main()
