"""A real all-reduce benchmark over message sizes, reported the way NVIDIA's nccl-tests report it.

For each size S (bytes per rank) it times ``iters`` back-to-back in-place ``all_reduce`` calls and reports the
average time per call t (nccl-tests average one such loop; we take the median over ``repeats`` loops, which
resists the noise of a shared machine), the algorithm bandwidth ``algbw = S / t`` and the bus bandwidth
``busbw = algbw * 2(n-1)/n`` (n ranks), as defined in nccl-tests' doc/PERFORMANCE.md: busbw is what each rank's
link carried, comparable with the hardware's peak whatever n is (the ring sends 2(n-1)/n of the data per rank).
gloo over loopback TCP here; NCCL over NVLink/PCIe/InfiniBand when there is one GPU per rank.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import psutil
import torch
import torch.distributed as dist

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.choices import COMM_DTYPES
from labkit.core.contention import ShareMeter
from labkit.core.device import device_label
from labkit.core.machine import cpu_count
from labkit.core.results import ResultStream, WriteError
from labkit.core.timing import Stopwatch
from labkit.core.validation import checked_int, positive_int, positive_ints
from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE, LOAD, Load, Verdict

DEFAULT_SIZES_BYTES = tuple(4 ** k for k in range(2, 13))   # 16 B .. 16 MiB, x4 steps


@dataclass(frozen=True)
class BenchRow:
    """One message size: time per all-reduce (s), algbw and busbw (GB/s, 1 GB = 1e9 B), wrong elements."""

    size_bytes: int
    count: int
    dtype: str
    world_size: int
    backend: str
    time_s: float
    algbw_gb_s: float
    busbw_gb_s: float
    wrong: int
    device: str
    cpu_share: float = 1.0      # the worst rank's share of a core while this size was timed (1.0: quiet)


def busbw_factor(world_size: int, collective: str = "all_reduce") -> float:
    """nccl-tests' correction from algbw to busbw: all_reduce 2(n-1)/n; reduce_scatter/all_gather (n-1)/n."""
    factors = {"all_reduce": 2 * (world_size - 1) / world_size, "reduce_scatter": (world_size - 1) / world_size,
               "all_gather": (world_size - 1) / world_size, "broadcast": 1.0, "reduce": 1.0}
    if collective not in factors:
        raise ValueError(f"collective must be one of {tuple(factors)}, got {collective!r}")
    return factors[collective]


def bandwidths_gb_s(size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all-reduce of ``size_bytes`` per rank that took ``time_s``."""
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * busbw_factor(world_size)


def check_sizes(sizes_bytes: Sequence[int], dtype: str = "float32") -> list[int]:
    """The message sizes as a list, each a positive whole number of ``dtype`` elements, or one clear ValueError."""
    itemsize = COMM_DTYPES[check_dtype(dtype)]
    sizes = list(positive_ints(sizes_bytes, "sizes_bytes"))
    bad = [s for s in sizes if s % itemsize]
    if bad:
        raise ValueError(f"every size in sizes_bytes must be a positive multiple of the element size: whole {dtype} "
                         f"elements of {itemsize} B each, got {bad}")
    return sizes


def check_dtype(dtype: str) -> str:
    """``dtype`` when the benchmark knows its element size, else one clear ValueError."""
    if dtype not in COMM_DTYPES:
        raise ValueError(f"dtype must be one of {tuple(COMM_DTYPES)}, got {dtype!r}")
    return dtype


BUFFERS_PER_RANK = 2            # the message plus the backend's own receive/staging copy of it
RANK_OVERHEAD_BYTES = 400 << 20  # a Python process with torch imported (gloo) or its CUDA context (NCCL)


def memory_needed_bytes(world_size: int, max_size_bytes: int, backend: str) -> int:
    """Memory the benchmark needs where it allocates: RAM for all gloo ranks together, one GPU's memory for NCCL."""
    per_rank = BUFFERS_PER_RANK * int(max_size_bytes) + RANK_OVERHEAD_BYTES
    return per_rank if backend == "nccl" else per_rank * int(world_size)


def check_memory(world_size: int, max_size_bytes: int, backend: str, available_bytes: int | None = None) -> None:
    """Refuse up front a benchmark that cannot fit (64G messages on a 23 GiB box), with what to change."""
    need = memory_needed_bytes(world_size, max_size_bytes, backend)
    if available_bytes is None:
        available_bytes = _available_bytes(backend)
    if need > available_bytes:
        where = "memory of one GPU" if backend == "nccl" else "RAM available"
        ranks = "per rank" if backend == "nccl" else f"x {world_size} ranks"
        raise ValueError(f"the largest message ({_gib(max_size_bytes)}) x {BUFFERS_PER_RANK} buffers {ranks} "
                         f"needs about {_gib(need)}, more than the {_gib(available_bytes)} of {where}; "
                         "lower --max-bytes/-e or --world-size")


def _available_bytes(backend: str) -> int:
    if backend == "nccl":
        return int(torch.cuda.get_device_properties(0).total_memory)
    return int(psutil.virtual_memory().available)


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def allreduce_benchmark(world_size: int, sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, backend: str = "auto",
                        iters: int = 20, warmup: int = 5, dtype: str = "float32", repeats: int = 3,
                        timeout_s: float = 300.0, rows_path: str | None = None) -> list[BenchRow]:
    """Time a real in-place all_reduce(SUM) over ``world_size`` processes for each size; one BenchRow per size.

    ``rows_path``: rank 0 saves every finished row there at once (JSON lines), so a timeout or Ctrl-C keeps them.
    """
    sizes = check_sizes(sizes_bytes, dtype)
    iters, repeats = positive_int(iters, "iters"), positive_int(repeats, "repeats")
    warmup = checked_int(warmup, "warmup", minimum=0)
    per_rank = launch(bench_worker, world_size, args=(sizes, iters, warmup, dtype, repeats, rows_path),
                      backend=backend, timeout_s=timeout_s, show_output=False)
    return per_rank[0]


def _check_sum(t: torch.Tensor, world_size: int) -> int:
    """Fill with rank+1, all-reduce once, count elements that differ from n(n+1)/2 (nccl-tests' #wrong)."""
    t.fill_(dist.get_rank() + 1)
    dist.all_reduce(t)
    expected = world_size * (world_size + 1) / 2
    tolerance = 1e-2 * expected if t.element_size() == 2 else 0.0  # half types round sums above 2048
    return int(((t.double() - expected).abs() > tolerance).sum().item())


def bench_worker(sizes: list[int], iters: int, warmup: int, dtype: str, repeats: int = 1,
                 rows_path: str | None = None) -> list[BenchRow]:
    """Runs on every rank under ``launch``: check, warm up, then time ``iters`` calls with honest synchronisation."""
    world, backend = dist.get_world_size(), dist.get_backend()
    stream = ResultStream(rows_path if dist.get_rank() == 0 else None, len(sizes), "message sizes")
    device = rank_device()
    label = device_label(device) if device.type == "cuda" else f"CPU ({world} gloo processes on {cpu_count()} cores)"
    rows = []
    for size in sizes:
        t = torch.zeros(size // COMM_DTYPES[dtype], dtype=getattr(torch, dtype), device=device)
        wrong = _check_sum(t, world)
        t.zero_()  # zeros stay zeros however often they are summed: no overflow, no denormals
        with ShareMeter() as meter:
            per_call_s = _time_all_reduce(t, iters, warmup, repeats, device)
        elapsed = torch.tensor([per_call_s, float(wrong)], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed)  # average the time over ranks, total the wrong elements
        share = torch.tensor([meter.share], dtype=torch.float64, device=device)
        dist.all_reduce(share, op=dist.ReduceOp.MIN)   # the worst-served rank sets the pace of a collective
        time_s = elapsed[0].item() / world
        algbw, busbw = bandwidths_gb_s(size, time_s, world)
        rows.append(BenchRow(size, t.numel(), dtype, world, backend, time_s, algbw, busbw, int(elapsed[1].item()),
                             label, float(share.item())))
        try:
            stream.add(rows[-1], to_json=asdict)
        except WriteError:       # keep measuring; the launcher saves (or names the failure) from the returned rows
            stream.path = None
    return rows


def _time_all_reduce(t: torch.Tensor, iters: int, warmup: int, repeats: int, device: torch.device) -> float:
    """Seconds per in-place all_reduce of ``t``: ``warmup`` untimed calls, then the median over ``repeats`` loops
    of ``iters`` back-to-back calls, each loop started together (barrier) and timed on the device's clock."""
    for _ in range(warmup):
        dist.all_reduce(t)
    loop_times_s = []
    for _ in range(repeats):
        dist.barrier()
        with Stopwatch(device) as watch:
            for _ in range(iters):
                dist.all_reduce(t)
        loop_times_s.append(watch.elapsed_s / iters)
    return statistics.median(loop_times_s)


def fit_latency_bandwidth(rows: Sequence[BenchRow]) -> tuple[float, float]:
    """Fit t(S) = a + b*S to measured rows (least squares on relative error, a >= 0 and b >= 0); (a seconds,
    b seconds per byte). Both bounds are physical: a CI run under load fitted b < 0 (its small sizes were slowed
    by a burst), a line no link draws; constrained, that run gives b = 0, which :func:`judge_link_fit` reads."""
    if len(rows) < 2:
        raise ValueError("need at least two message sizes to fit latency and bandwidth")
    size = np.array([r.size_bytes for r in rows], dtype=float)
    t = np.array([r.time_s for r in rows])
    design = np.stack([np.ones_like(size), size], axis=1) / t[:, None]  # divide by t: every size counts equally
    target = np.ones_like(t)
    (a, b), *_ = np.linalg.lstsq(design, target, rcond=None)
    if a >= 0 and b >= 0:
        return float(a), float(b)
    # The optimum lies on a bound: the best of the two one-term fits (each a one-variable least squares).
    one_term = []
    for column in (0, 1):
        x = design[:, column]
        coef = max(0.0, float(x @ target / (x @ x)))
        one_term.append((float(np.sum((x * coef - target) ** 2)), column, coef))
    _, column, coef = min(one_term)
    return (coef, 0.0) if column == 0 else (0.0, coef)


def judge_link_fit(claim: str, rows: Sequence[BenchRow]) -> Verdict:
    """Do both terms of t = a + b*S matter? Each must carry the time at one end of the measured sizes: the latency
    a above the bytes' b*S at the smallest message, the bytes above a at the largest. The rival, one term alone
    (a line with b*S negligible everywhere, or a = 0), fails that. Under load a miss is INCONCLUSIVE with the worst
    rank's measured share; on a quiet run it failed."""
    a, b = fit_latency_bandwidth(rows)
    smallest, largest = min(r.size_bytes for r in rows), max(r.size_bytes for r in rows)
    detail = (f"a = {a:.2e} s, b = {b:.2e} s/byte: b*S is {b * smallest / a if a > 0 else math.inf:.2g}x a at "
              f"{smallest} B and {b * largest / a if a > 0 else math.inf:.3g}x a at {largest} B")
    rival = "one term alone (a = 0, or b*S below a at every size)"
    if a > 0 and b * smallest < a < b * largest:
        return Verdict(claim, CHECKED, f"{detail}; rules out {rival}", rival=rival)
    worst = min(rows, key=lambda r: r.cpu_share)
    load = Load.measured({f"the worst rank at {worst.size_bytes} B": worst.cpu_share})
    if load.busy:
        return Verdict(claim, INCONCLUSIVE, f"{detail}; {load.reason()}", kind=LOAD, rival=rival)
    return Verdict(claim, FAILED, f"{detail}; cannot tell the fit from {rival}", rival=rival)


def format_nccl_tests_table(rows: Sequence[BenchRow]) -> str:
    """The rows as nccl-tests' all_reduce_perf prints them (in-place columns; time in microseconds)."""
    lines = [f"# all_reduce, {rows[0].world_size} ranks, {rows[0].backend}, {rows[0].device}" if rows else "#",
             f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7} {'time':>8} {'algbw':>7} "
             f"{'busbw':>7} {'#wrong':>6}",
             f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>7} {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7}"]
    for r in rows:
        lines.append(f" {r.size_bytes:>11} {r.count:>13} {_short(r.dtype):>9} {'sum':>7} {-1:>7} "
                     f"{r.time_s * 1e6:>8.1f} {r.algbw_gb_s:>7.3f} {r.busbw_gb_s:>7.3f} {r.wrong:>6}")
    return "\n".join(lines)


def _short(dtype: str) -> str:
    return {"float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16"}.get(dtype, dtype)
