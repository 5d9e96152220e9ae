"""What activation checkpointing costs in time, and why: plain vs checkpointed steps at several batch sizes.

Notebook 11's claim that checkpointing every block costs "about one extra forward pass" (Chen et al. 2016, section 4)
read 116% time added against a 45% forward share on an H200 (ResNet-18 at batch 64, 32x32 images). This benchmark
takes the claim apart on whatever device it runs on: for each model and batch, interleaved rounds of the plain step,
the checkpointed step and a forward alone, each as device-honest time (synchronised wall on a GPU, process CPU time on
a CPU) and as the host's launch time (until the step's Python returned, before the wait: CUDA's synchronize spins, so
the host's CPU time always equals the wall and tells nothing). On a GPU, launch time near the step's wall time means
the step is launch-bound: the host, not the GPU, sets its pace, and the recompute then costs its kernel launches plus
the checkpoint hooks' Python, not its FLOPs.

    python benchmarks/checkpoint_price.py --json runs/checkpoint_price.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import labkit  # noqa: F401  (before torch: sizes its threads to the CPUs this process may use)
import torch

from labkit.core.device import device_label, get_device
from labkit.core.env import pick
from labkit.sharding.checkpointing import compare_step_time, with_checkpointing
from labkit.sharding.step_peak import build_workload


def measure(workload: str, batch: int, device: torch.device, repeats: int) -> dict:
    """One row: the plain, checkpointed and forward times (device and host) of ``workload`` at ``batch``."""
    model, shape, segments = build_workload(workload, image=32, d_model=64, layers=4, seq_len=pick(fast=128, full=512))
    model = model.to(device)
    x = torch.randn(batch, *shape, device=device)
    t = compare_step_time(model, with_checkpointing(model, segments), x, repeats=repeats)
    return dict(model=workload, batch=batch, plain_step_ms=1e3 * t.plain_step_s, ckpt_step_ms=1e3 * t.checkpointed_step_s,
                forward_ms=1e3 * t.forward_s, plain_launch_ms=1e3 * t.plain_launch_s, ckpt_launch_ms=1e3 * t.checkpointed_launch_s,
                forward_launch_ms=1e3 * t.forward_launch_s, time_added=t.time_added_fraction,
                forward_share=t.predicted_added_fraction, launch_bound=t.launch_bound_fraction)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=pick(fast=5, full=10))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    device = get_device()
    batches = args.batches or pick(fast=[4, 16], full=[16, 64, 256, 1024])
    rows = []
    print(f"checkpoint price on {device_label(device)}: time added vs the forward's share; launch/step near 1 = "
          "launch-bound")
    for workload in ("resnet18", "transformer"):
        for batch in batches:
            r = measure(workload, batch, device, args.repeats)
            rows.append(r)
            print(f"{workload:11s} b{batch:5d}: plain {r['plain_step_ms']:8.2f} ms (launch {r['plain_launch_ms']:7.2f}), "
                  f"ckpt {r['ckpt_step_ms']:8.2f} ms (launch {r['ckpt_launch_ms']:7.2f}), forward {r['forward_ms']:7.2f} ms "
                  f"(launch {r['forward_launch_ms']:6.2f}); added {r['time_added']:+.0%} vs forward share "
                  f"{r['forward_share']:.0%}; launch/step {r['launch_bound']:.2f}")
    report = {"device": device_label(device), "rows": rows}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
