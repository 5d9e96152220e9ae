"""Checked exercises for notebooks 03 and 03b: read a profiler trace by hand (busy time, host-device syncs); the
roofline (attainable FLOP/s, a matmul's arithmetic intensity).

The learner parses the Chrome-trace dict that ``torch.profiler`` writes; the references are the kit's trace
readers in :mod:`labkit.profile.traces`, run on seeded synthetic traces of the same format.
"""
from __future__ import annotations

import random

from labkit.core.exercises import Exercise, Mistake
from labkit.profile.roofline import attainable_flops_per_s
from labkit.profile.traces import count_ops, gpu_busy_s


def _trace(seed: int) -> dict:
    """A small Chrome trace: ProfilerStep spans, CPU ops (some ``aten::item``), overlapping GPU kernels (us)."""
    rng = random.Random(seed)
    events, t = [], 0.0
    for step in range(rng.randint(2, 4)):
        dur = rng.randint(2_000, 5_000)
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t, "dur": dur,
                       "pid": 1, "tid": 1})
        for _ in range(rng.randint(1, 4)):
            start = t + rng.randint(0, dur - 100)
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": start, "dur": 50,
                           "pid": 1, "tid": 1})
        for _ in range(rng.randint(3, 8)):
            start = t + rng.randint(0, dur - 400)
            events.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": start, "dur": rng.randint(50, 400),
                           "pid": 0, "tid": 7})
        t += dur + rng.randint(100, 2_000)
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": t + 10, "dur": 5, "pid": 1, "tid": 1})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 3_000, "pid": 1, "tid": 1})
    return {"traceEvents": events}


def _trace_cases(seed: int = 0) -> list[dict]:
    return [{"trace": _trace(seed + i)} for i in range(6)]


def gpu_busy_reference(trace: dict) -> float:
    """Seconds in which at least one kernel ran: the union of the kernel intervals (``traces.gpu_busy_s``)."""
    return gpu_busy_s(trace) or 0.0


GPU_BUSY = Exercise(
    "gpu_busy_s", "seconds the GPU was busy in a trace: the union of its kernel events (ts and dur are in us)",
    gpu_busy_reference, _trace_cases,
    (Mistake("sum_of_durations", lambda trace: sum(e["dur"] for e in trace["traceEvents"]
                                                   if e.get("cat") == "kernel") * 1e-6,
             "kernels on different streams overlap: merge the intervals before adding, or overlap counts twice"),
     Mistake("microseconds", lambda trace: gpu_busy_s(trace) * 1e6,
             "Chrome traces store ts and dur in MICROseconds: multiply by 1e-6 to get seconds"),
     Mistake("all_events", lambda trace: gpu_busy_s({"traceEvents": [dict(e, cat="kernel")
                                                                      for e in trace["traceEvents"]]}),
             "keep only GPU events (cat 'kernel', and memcpy/memset): CPU ops and step spans are host time")),
    "keep events with cat 'kernel', merge overlapping [ts, ts+dur] intervals, add their lengths, x 1e-6")


def item_syncs_reference(trace: dict) -> int:
    """How many ``aten::item`` calls (each a host-device sync) lie inside the profiled steps (``count_ops``)."""
    return count_ops(trace, "aten::item")


ITEM_SYNCS = Exercise(
    "item_syncs", "how many .item() calls (aten::item CPU ops, each one a sync) ran inside the ProfilerStep spans",
    item_syncs_reference, _trace_cases,
    (Mistake("outside_steps_too", lambda trace: sum(e.get("name") == "aten::item" for e in trace["traceEvents"]),
             "count only the calls inside a ProfilerStep#N span: the rest ran before or after the profiled steps"),
     Mistake("all_ops", lambda trace: count_ops(trace, "aten::item") + count_ops(trace, "aten::mm"),
             "count only the events named exactly aten::item")),
    "an event is inside a step when step.ts <= e.ts and e.ts + e.dur <= step.ts + step.dur")


# ------------------------------------------------------------------------------------ 03b: the roofline
def attainable_reference(flops: float, bytes_moved: float, peak_flops_per_s: float,
                         bandwidth_bytes_per_s: float) -> float:
    """FLOP/s an operator can reach: min(peak, intensity x bandwidth), intensity = FLOPs / bytes (Williams et al.
    2009, eq. 1; :func:`labkit.profile.roofline.attainable_flops_per_s`)."""
    return attainable_flops_per_s(flops / bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s)


def _roof_cases(seed: int = 31) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(10):
        peak, bw = 10 ** rng.uniform(10, 15), 10 ** rng.uniform(9, 12.5)
        ridge = peak / bw
        intensity = ridge * 10 ** rng.uniform(-2, 2)           # both sides of the ridge point
        nbytes = float(rng.randint(2**10, 2**30))
        cases.append({"flops": intensity * nbytes, "bytes_moved": nbytes, "peak_flops_per_s": peak,
                      "bandwidth_bytes_per_s": bw})
    return cases


def attainable_cases_for(peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> list[dict]:
    """This run's measured roofs, with operators at 1/10, 1 and 10x the ridge point, then random cases."""
    ridge, nbytes = peak_flops_per_s / bandwidth_bytes_per_s, float(2**24)
    return [{"flops": f * ridge * nbytes, "bytes_moved": nbytes, "peak_flops_per_s": float(peak_flops_per_s),
             "bandwidth_bytes_per_s": float(bandwidth_bytes_per_s)} for f in (0.1, 1.0, 10.0)] + _roof_cases()


ATTAINABLE = Exercise(
    "attainable_flops_per_s", "the FLOP/s an operator of `flops` FLOPs moving `bytes_moved` bytes can reach on "
    "roofs of peak FLOP/s and bandwidth (bytes/s)",
    attainable_reference, _roof_cases,
    (Mistake("max_not_min", lambda flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s:
             max(peak_flops_per_s, flops / bytes_moved * bandwidth_bytes_per_s),
             "the roofline is the LOWER of the two roofs: an operator is held back by whichever wall it hits first, "
             "so take min(peak, intensity x bandwidth)"),
     Mistake("bytes_per_flop", lambda flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s:
             min(peak_flops_per_s, bytes_moved / flops * bandwidth_bytes_per_s),
             "arithmetic intensity is FLOPs per byte (flops / bytes_moved), not bytes per FLOP")),
    "intensity = flops / bytes_moved; attainable = min(peak_flops_per_s, intensity x bandwidth_bytes_per_s)")


def matmul_intensity_reference(m: int, n: int, k: int, bytes_per_element: int) -> float:
    """FLOP per byte of C = A @ B (A m x k, B k x n): 2mnk FLOPs (a multiply-add is 2), reading A and B and
    writing C once each: (mk + kn + mn) elements (Williams et al. 2009, section 2)."""
    return 2 * m * n * k / ((m * k + k * n + m * n) * bytes_per_element)


def _matmul_cases(seed: int = 32) -> list[dict]:
    rng = random.Random(seed)
    return [{"m": rng.choice([1, 8, 64, 512, 4096]), "n": rng.randint(1, 4096), "k": rng.randint(1, 4096),
             "bytes_per_element": rng.choice([2, 4])} for _ in range(10)] + [
        {"m": 1024, "n": 1024, "k": 1024, "bytes_per_element": 4}]


MATMUL_INTENSITY = Exercise(
    "matmul_intensity", "the arithmetic intensity (FLOP/byte) of an (m x k) @ (k x n) matmul, each matrix moved "
    "once, elements of `bytes_per_element` bytes",
    matmul_intensity_reference, _matmul_cases,
    (Mistake("fma_as_one", lambda m, n, k, bytes_per_element: m * n * k / ((m * k + k * n + m * n)
                                                                          * bytes_per_element),
             "a multiply-add is 2 FLOPs (one multiply, one add): a matmul does 2mnk FLOPs"),
     Mistake("no_output_write", lambda m, n, k, bytes_per_element: 2 * m * n * k / ((m * k + k * n)
                                                                                   * bytes_per_element),
             "the output is written to memory too: count m x n elements of C besides A and B")),
    "FLOPs = 2mnk; bytes = (mk + kn + mn) x bytes_per_element; intensity = FLOPs / bytes")
