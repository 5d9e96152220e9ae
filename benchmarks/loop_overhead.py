"""How much does instrumentation cost? labkit.training.loop.train vs a bare PyTorch loop, same model/batch/device.

Interleaved repeats (bare, instrumented, bare, ...) so that drifting machine load hits both alike;
the figure is the median of the per-pair time ratios. Target: instrumented/bare < 1.02 over the steps, for both
instruments: per-phase timing (the default: five pooled CUDA events a step, read a window behind) and whole-step
timing (``timing='step'``: one event a step, for launch-bound steps where even five event records show); what a call of ``train`` costs once, before and after
its steps (sampler, memory baseline, summary), is reported on its own as start-up, in ms. The classic per-phase-sync timer
(``sync_every_step=True``) is measured too: the H100 showed it 25-28% slower than a bare loop. On a CPU
the script also reports the ratio of process CPU time, which other programs' load barely disturbs. On a GPU it also
measures what one CUDA event record + read costs on the host: the floor of whole-step timing, which one event a step
cannot go below; where a short step misses 2%, the claim is stated against that floor (NOT CHECKED on a CPU).

    python benchmarks/loop_overhead.py                       # ResNet-18 (32x32) and the small CNN
    python benchmarks/loop_overhead.py --models small_cnn --json runs/loop_overhead.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import labkit  # noqa: F401  (before torch: sizes its threads to the CPUs this process may use)
import torch
from torch import nn

from labkit.core.clock import now_s, process_time_s
from labkit.core.device import device_label, get_device
from labkit.core.env import pick
from labkit.core.models import build_model
from labkit.core.timing import synchronize
from labkit.core.validation import positive_int
from labkit.training.config import TrainConfig
from labkit.training.loop import train

OVERHEAD_TARGET = 0.02      # issue 13: the instrumented loop within 2% of a bare loop


def bare_loop(model: nn.Module, batches: list, device: torch.device, lr: float = 0.05) -> tuple[float, float]:
    """The loop everybody writes first; returns (wall seconds, process CPU seconds)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    synchronize(device)
    start, cpu_start = now_s(), process_time_s()
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    synchronize(device)
    return now_s() - start, process_time_s() - cpu_start


def instrumented_loop(model: nn.Module, batches: list, device: torch.device, sync_every_step: bool = False,
                      profile: bool = False, timing: str = "phases") -> tuple[float, float, float]:
    """labkit.training.loop.train over the same batches (phase marks, records, sampler, callback hook); returns
    (wall seconds of the whole call, process CPU seconds, wall seconds of its steps alone). The difference of the
    two walls is the run's fixed start-up and read-out (sampler, memory baseline, summary), paid once per call."""
    cfg = TrainConfig(steps=len(batches), progress=False, evaluate=False, profile_model=profile,
                      device=str(device), warmup_steps=0, sync_every_step=sync_every_step, log_every=len(batches),
                      timing=timing)
    start, cpu_start = now_s(), process_time_s()
    result = train(model, batches, cfg, callback=lambda rec, progress: None)
    return now_s() - start, process_time_s() - cpu_start, result.extra["wall_s"]


def measure(name: str, batch_size: int, steps: int, repeats: int, device: torch.device) -> dict:
    """Median ratios instrumented/bare over interleaved repeats: default (cheap) mode and per-phase sync."""
    torch.manual_seed(0)
    model = build_model(name).to(device)
    batches = [(torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))) for _ in range(steps)]
    if device.type == "cuda":
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    bare_loop(model, batches[:2], device)                       # warm-up: allocator, kernels, threads
    instrumented_loop(model, batches[:2], device)
    runs = {"bare": [], "cheap": [], "step": [], "sync": []}
    ratios, cpu_ratios, step_ratios, sync_ratios, call_ratios, startups = [], [], [], [], [], []
    for r in range(repeats):
        order = ["bare", "cheap", "step", "sync"] if r % 2 == 0 else ["sync", "step", "cheap", "bare"]
        t = {}
        for which in order:
            t[which] = (bare_loop(model, batches, device) if which == "bare"
                        else instrumented_loop(model, batches, device, sync_every_step=which == "sync",
                                               timing="step" if which == "step" else "phases"))
            runs[which].append(t[which][0] if which == "bare" else t[which][2])
        ratios.append(t["cheap"][2] / t["bare"][0])                 # the steps: the per-step overhead
        step_ratios.append(t["step"][2] / t["bare"][0])             # whole-step timing: one event a step
        call_ratios.append(t["cheap"][0] / t["bare"][0])            # the whole call, start-up included
        startups.append(t["cheap"][0] - t["cheap"][2])
        cpu_ratios.append(t["cheap"][1] / t["bare"][1])
        sync_ratios.append(t["sync"][2] / t["bare"][0])
    return dict(model=name, batch_size=batch_size, steps=steps, repeats=repeats,
                bare_step_s=statistics.median(runs["bare"]) / steps,
                instrumented_step_s=statistics.median(runs["cheap"]) / steps,
                ratio=statistics.median(ratios), step_timing_ratio=statistics.median(step_ratios),
                cpu_ratio=statistics.median(cpu_ratios),
                sync_every_step_ratio=statistics.median(sync_ratios), call_ratio=statistics.median(call_ratios),
                startup_s=statistics.median(startups))


def event_cost_s(device: torch.device, events: int = 500, repeats: int = 5) -> tuple[float | None, str]:
    """Host seconds one CUDA event costs the whole-step instrument each step: one ``record`` plus one read of a
    finished pair (``elapsed_time``), median of ``repeats``; (None, why) where there is no CUDA device."""
    if device.type != "cuda":
        return None, "NOT CHECKED: no CUDA device here (CUDA events exist only on a GPU; a CPU step is timed by the host clock)"
    costs = []
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(events + 1)]      # pooled, as the loop's are
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start = now_s()
        for e in pool:
            e.record()
        record_s = (now_s() - start) / len(pool)
        torch.cuda.synchronize(device)
        start = now_s()
        for a, b in zip(pool, pool[1:]):
            a.elapsed_time(b)
        costs.append(record_s + (now_s() - start) / events)
    return statistics.median(costs), "measured"


def overhead_claim(row: dict, event_s: float | None, why: str) -> str:
    """The 2% target for whole-step timing, bounded by the event floor where it is missed. Rival: 'the excess is
    the instrument's own Python, not the event' -- rejected only when the overhead stays within floor + 2%."""
    over = row["step_timing_ratio"] - 1
    if event_s is None:
        return why
    floor = event_s / row["bare_step_s"]
    if over < OVERHEAD_TARGET:
        return f"met: {over:+.1%} < {OVERHEAD_TARGET:.0%} (event floor {floor:.1%})"
    if over <= floor + OVERHEAD_TARGET:       # the target applied above what one event costs on this host
        return f"bounded: {over:+.1%} is within {OVERHEAD_TARGET:.0%} of the floor of one event record+read ({floor:.1%})"
    return f"NOT met: {over:+.1%} exceeds the event floor {floor:.1%} by more than {OVERHEAD_TARGET:.0%}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "small_cnn"])
    parser.add_argument("--repeats", type=lambda v: positive_int(int(v), "--repeats"), default=pick(fast=7, full=11))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 gives steadier figures on a shared machine)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.json is not None and args.json.is_dir():
        parser.error(f"--json {args.json} is a folder; give a file path such as {args.json / 'loop_overhead.json'}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = get_device()
    sizes = {"resnet18": pick(fast=(16, 6), full=(128, 50)), "small_cnn": pick(fast=(64, 30), full=(256, 100))}
    label = device_label(device)
    print(f"loop overhead on {label}; {args.repeats} interleaved repeats, median ratio")
    event_s, why = event_cost_s(device)
    print(f"one CUDA event record + read on the host: {1e6 * event_s:.1f} us" if event_s is not None else
          f"whole-step event floor: {why}")
    rows = []
    for name in args.models:
        bs, steps = sizes.get(name, (32, 20))
        m = measure(name, bs, steps, args.repeats, device)
        m.update(event_record_read_s=event_s, overhead_claim=overhead_claim(m, event_s, why),
                 **({} if event_s is not None else {"event_floor_reason": why}))
        rows.append(m)
        print(f"{name:10s} batch {bs:4d} x {steps:3d} steps: bare {m['bare_step_s'] * 1e3:.2f} ms/step; "
              f"instrumented/bare = {m['ratio']:.4f} (overhead {100 * (m['ratio'] - 1):+.2f}%; whole call "
              f"{m['call_ratio']:.4f}, start-up {m['startup_s'] * 1e3:.1f} ms); whole-step timing "
              f"{m['step_timing_ratio']:.4f}; "
              f"CPU-time ratio {m['cpu_ratio']:.4f}; per-phase sync (sync_every_step=True) "
              f"{m['sync_every_step_ratio']:.4f}; whole-step claim: {m['overhead_claim']}")
    report = {"device": label, "rows": rows}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
