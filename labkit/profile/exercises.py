"""Checked exercises for notebook 03: read a profiler trace by hand (busy time, host-device syncs).

The learner parses the Chrome-trace dict that ``torch.profiler`` writes; the references are the kit's trace
readers in :mod:`labkit.profile.traces`, run on seeded synthetic traces of the same format.
"""
from __future__ import annotations

import random

from labkit.core.exercises import Exercise, Mistake
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


def _trace_cases() -> list[dict]:
    return [{"trace": _trace(seed)} for seed in range(6)]


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
