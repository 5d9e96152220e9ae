"""Read a Chrome/Perfetto JSON trace written by ``torch.profiler`` and sum where each step's time went.

The training step labels its phases with ``torch.profiler.record_function("labkit/<category>")``;
this module finds those labels inside each ``ProfilerStep#N`` and adds them up. Whatever part of a
step no label covers is reported as ``idle`` (Python overhead, waiting, unlabelled work).
The summary is computed from the very file a learner opens in Perfetto UI, so the two always agree.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

LABEL_PREFIX = "labkit/"
LABELLED = ("data_loading", "h2d", "forward", "backward", "optimizer", "sync", "communication")
CATEGORIES = LABELLED + ("idle",)
COMM_PATTERN = re.compile(r"nccl|gloo|all_?reduce|all_?gather|reduce_scatter|broadcast|c10d", re.IGNORECASE)
STEP_PATTERN = re.compile(r"^ProfilerStep#(\d+)$")


def load_trace(path: str | Path) -> dict:
    """Parse one JSON trace file (clear error when missing or not a trace)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file {path} does not exist; run the profiler first")
    try:
        trace = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); "
                         "was the trace written completely?") from None
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ValueError(f"{path} has no 'traceEvents'; it is not a Chrome/Perfetto trace")
    return trace


def step_events(trace: dict) -> list[dict]:
    """The ``ProfilerStep#N`` spans, sorted by step number."""
    steps = [e for e in trace["traceEvents"]
             if e.get("ph") == "X" and STEP_PATTERN.match(str(e.get("name", "")))]
    return sorted(steps, key=lambda e: int(STEP_PATTERN.match(e["name"]).group(1)))


def step_numbers(trace: dict) -> list[int]:
    """The step numbers N of the ``ProfilerStep#N`` spans in a trace."""
    return [int(STEP_PATTERN.match(e["name"]).group(1)) for e in step_events(trace)]


def _inside(event: dict, span: dict) -> bool:
    start, end = span["ts"], span["ts"] + span["dur"]
    return event.get("ph") == "X" and start <= event["ts"] and event["ts"] + event.get("dur", 0) <= end + 1e-3


def _host_events(trace: dict, span: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("tid") == span.get("tid") and e.get("pid") == span.get("pid")
            and e is not span and "dur" in e and _inside(e, span)]


def step_categories_s(trace: dict, span: dict) -> dict[str, float]:
    """Seconds per category within one ProfilerStep span (host timeline); idle = the unlabelled rest."""
    events = _host_events(trace, span)
    labelled = [e for e in events if str(e.get("name", "")).startswith(LABEL_PREFIX)]
    out = dict.fromkeys(CATEGORIES, 0.0)
    for e in labelled:
        cat = e["name"][len(LABEL_PREFIX):]
        if cat in out and cat != "idle":
            out[cat] += e["dur"] * 1e-6
    for e in events:   # communication ops that no label already covers
        if e.get("cat") == "cpu_op" and COMM_PATTERN.search(str(e.get("name", ""))) \
                and not any(_inside(e, lab) for lab in labelled):
            out["communication"] += e["dur"] * 1e-6
    out["idle"] = max(0.0, span["dur"] * 1e-6 - sum(out[c] for c in LABELLED))
    return out


def count_ops(trace: dict, name: str) -> int:
    """How many CPU operator events called ``name`` lie inside the profiled steps."""
    spans = step_events(trace)
    return sum(1 for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") == name
               and any(_inside(e, s) for s in spans))


def peak_memory_bytes(trace: dict, device_type: int = 0) -> int | None:
    """Largest 'Total Allocated' in the trace's memory events (0 = CPU, 1 = CUDA); None without them.

    It counts bytes allocated *while profiling* on top of what existed before (weights, optimizer state).
    """
    totals = [e["args"]["Total Allocated"] for e in trace["traceEvents"]
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == device_type]
    return int(max(totals)) if totals else None


def gpu_busy_s(trace: dict) -> float | None:
    """Seconds during which at least one GPU kernel or memcpy ran (union of intervals); None on CPU."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    if not spans:
        return None
    busy_us, cur_start, cur_end = 0.0, *spans[0]
    for start, end in spans[1:]:
        if start > cur_end:
            busy_us += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return (busy_us + cur_end - cur_start) * 1e-6


@dataclass(frozen=True)
class TraceStats:
    """What one trace file says: its steps, their time by category, memory and sync points."""

    path: Path
    steps: list[int]
    step_time_s: list[float]
    category_s: dict[str, float]          # summed over the trace's steps
    peak_mem_bytes: int | None
    item_calls: int
    gpu_busy_s: float | None = field(default=None)


def summarize_trace(path: str | Path, device_type: int = 0) -> TraceStats:
    """Parse a trace file and total its steps by category."""
    trace = load_trace(path)
    spans = step_events(trace)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for span in spans:
        for cat, sec in step_categories_s(trace, span).items():
            totals[cat] += sec
    return TraceStats(Path(path), step_numbers(trace), [s["dur"] * 1e-6 for s in spans], totals,
                      peak_memory_bytes(trace, device_type), count_ops(trace, "aten::item"), gpu_busy_s(trace))
