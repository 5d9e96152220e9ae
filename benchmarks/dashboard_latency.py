"""How live is the batch-size dashboard? Seconds from pressing Run to the first plotted point, and between plot
updates, on this machine: quiet, and with one core kept busy by a spinning process (started and killed here).

The two conditions take turns, round by round (labkit.core.clock.interleaved), so load that comes and goes
on a shared machine falls on both. Each round is a fresh dashboard (notebook 02's defaults: small_cnn, batch
32, the digits) running ``--steps`` steps; the clock starts where a click on Run starts it (``run()``), and
stops when the plot's PNG is handed to the widget (the browser shows it one websocket message later). Also
reported: the CPU this process got (process CPU seconds per wall second) during the run.

    .venv/bin/python benchmarks/dashboard_latency.py --rounds 5 --steps 40
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

import labkit  # noqa: F401  (before torch: sizes its threads to the CPUs this process may use)
import torch

from labkit.core.clock import interleaved, now_s, process_time_s
from labkit.core.data import load_data
from labkit.ui.batch_runs import update_latency
from labkit.ui.dashboard import BatchSizeDashboard

SPIN = "while True: pass"


def one_run(data, steps: int) -> dict:
    """A fresh dashboard, one blocking run: latency to the first plot, median gap between plots, CPU got."""
    dash = BatchSizeDashboard(data=data, steps=steps, ceiling_steps=0)
    dash.limit()                                   # built when the cell is shown, before anyone presses Run
    wall0, cpu0 = now_s(), process_time_s()
    run = dash.run(blocking=True)
    cpu_share = (process_time_s() - cpu0) / (now_s() - wall0)
    first_s, between_s = update_latency(run)
    return {"first_s": first_s, "between_s": between_s, "cpu_cores_got": cpu_share, "updates": len(run.update_s)}


def busy_run(data, steps: int) -> dict:
    """The same run with one core kept busy by a spinning Python process (killed afterwards, whatever happens)."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        return one_run(data, steps)
    finally:
        spinner.kill()
        spinner.wait(timeout=10)


def main() -> None:
    """Interleaved quiet and busy rounds; one line per condition."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    data = load_data(train_limit=None, val_limit=128)
    one_run(data, 4)                                   # warm-up: imports, first-call costs
    results = interleaved({"quiet": lambda: one_run(data, args.steps),
                           "one core busy": lambda: busy_run(data, args.steps)}, rounds=args.rounds)
    print(f"torch threads {torch.get_num_threads()}, {args.rounds} rounds of {args.steps} steps, small_cnn bs=32")
    for name, rows in results.items():
        first = [r["first_s"] for r in rows]
        between = [r["between_s"] for r in rows if r["between_s"] is not None]
        cores = [r["cpu_cores_got"] for r in rows]
        print(f"{name:>14}: first plotted point {statistics.median(first):.2f} s (median; range {min(first):.2f}-"
              f"{max(first):.2f}); between updates {statistics.median(between):.2f} s (median of rounds' medians; "
              f"range {min(between):.2f}-{max(between):.2f}); CPU got {statistics.median(cores):.2f} cores")


if __name__ == "__main__":
    main()
