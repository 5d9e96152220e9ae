"""How much does instrumentation cost? labkit.loop.train vs a bare PyTorch loop, same model/batch/device.

Interleaved repeats (bare, instrumented, bare, ...) so that drifting machine load hits both alike;
the figure is the median of the per-pair time ratios. Target: overhead < 3%. On a CPU the script also
reports the ratio of *process CPU time* (time.process_time), which other programs' load on a shared
machine barely disturbs; on a GPU the wall-clock ratio is the one that counts.

    python benchmarks/loop_overhead.py            # ResNet-18 (32x32) and the small CNN
    python benchmarks/loop_overhead.py --repeats 9 --models small_cnn
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from labkit.env import device_label, get_device, pick
from labkit.loop import TrainConfig, train
from labkit.models import build_model
from labkit.timing import synchronize


def bare_loop(model: nn.Module, batches: list, device: torch.device, lr: float = 0.05) -> tuple[float, float]:
    """The loop everybody writes first; returns (wall seconds, process CPU seconds)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - start, time.process_time() - cpu_start


def instrumented_loop(model: nn.Module, batches: list, device: torch.device, profile: bool) -> tuple[float, float]:
    """labkit.loop.train over the same batches (per-step sync, records, sampler, callback hook)."""
    cfg = TrainConfig(steps=len(batches), progress=False, evaluate=False, profile_model=profile,
                      device=str(device), warmup_steps=0)
    start, cpu_start = time.perf_counter(), time.process_time()
    train(model, batches, cfg, callback=lambda rec, so_far: None)
    return time.perf_counter() - start, time.process_time() - cpu_start


def measure(name: str, batch_size: int, steps: int, repeats: int, device: torch.device) -> dict:
    """Median ratio instrumented/bare over interleaved repeats, without and with the one-time probe."""
    torch.manual_seed(0)
    model = build_model(name).to(device)
    batches = [(torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))) for _ in range(steps)]
    bare_loop(model, batches[:2], device)                       # warm-up: allocator, kernels, threads
    ratios, cpu_ratios, ratios_probe, bare_s = [], [], [], []
    for r in range(repeats):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        t = {}
        for which in order:
            t[which] = bare_loop(model, batches, device) if which == 0 else instrumented_loop(model, batches, device, False)
        ratios.append(t[1][0] / t[0][0])
        cpu_ratios.append(t[1][1] / t[0][1])
        bare_s.append(t[0][0])
    for _ in range(max(1, repeats // 2)):
        b = bare_loop(model, batches, device)
        ratios_probe.append(instrumented_loop(model, batches, device, True)[0] / b[0])
    return dict(model=name, batch=batch_size, steps=steps, bare_s=statistics.median(bare_s),
                ratio=statistics.median(ratios), cpu_ratio=statistics.median(cpu_ratios),
                ratio_with_probe=statistics.median(ratios_probe))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "small_cnn"])
    parser.add_argument("--repeats", type=int, default=pick(fast=7, full=11))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 gives steadier figures on a shared machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = get_device()
    sizes = {"resnet18": pick(fast=(16, 6), full=(128, 50)), "small_cnn": pick(fast=(64, 30), full=(256, 100))}
    print(f"loop overhead on {device_label(device)}; {args.repeats} interleaved repeats, median ratio")
    for name in args.models:
        bs, steps = sizes.get(name, (32, 20))
        m = measure(name, bs, steps, args.repeats, device)
        print(f"{name:10s} batch {bs:4d} x {steps:3d} steps: bare {m['bare_s']:.3f} s; "
              f"instrumented/bare = {m['ratio']:.4f} (overhead {100 * (m['ratio'] - 1):+.2f}%); "
              f"CPU-time ratio {m['cpu_ratio']:.4f}; with the one-time FLOP/memory probe {m['ratio_with_probe']:.4f}")


if __name__ == "__main__":
    main()
