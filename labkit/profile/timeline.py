"""One profiled training step as a picture (notebook 03): the ``labkit/<category>`` phases of one ``ProfilerStep#N``
drawn as horizontal bars on the host timeline, one row per category, the whole step as a grey bar above them.

The bars are read from the very trace file a learner opens in Perfetto UI (:func:`labkit.profile.traces.load_trace`),
so the picture and the trace always agree; white between the bars is time no label covers (the summary's ``idle``).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from labkit.profile.traces import LABEL_PREFIX, LABELLED, STEP_PATTERN, step_events

CATEGORY_COLOURS = {"data_loading": "C3", "h2d": "C7", "forward": "C0", "backward": "C1", "optimizer": "C2",
                    "sync": "C4", "communication": "C5"}


@dataclass(frozen=True)
class Phase:
    """One labelled phase of a step: its category and where it lies, in seconds from the step's start."""

    category: str
    start_s: float
    duration_s: float


def pick_step(trace: dict, step: int | None = None) -> dict:
    """The ``ProfilerStep#step`` span of a trace; ``None`` picks the step of median duration (a typical one)."""
    spans = step_events(trace)
    if not spans:
        raise ValueError("the trace holds no ProfilerStep#N span: was it written by torch.profiler on a schedule?")
    if step is None:
        median_us = statistics.median_low(s["dur"] for s in spans)
        return next(s for s in spans if s["dur"] == median_us)
    found = [s for s in spans if int(STEP_PATTERN.match(s["name"]).group(1)) == step]
    if not found:
        numbers = [int(STEP_PATTERN.match(s["name"]).group(1)) for s in spans]
        raise ValueError(f"step {step} is not in the trace; its profiled steps are {numbers}")
    return found[0]


def step_phases(trace: dict, span: dict) -> list[Phase]:
    """The labelled phases inside one step span, on the step's own host thread, in the order they started."""
    start, end = span["ts"], span["ts"] + span["dur"]
    phases = []
    for e in trace["traceEvents"]:
        name = str(e.get("name", ""))
        if e.get("ph") != "X" or not name.startswith(LABEL_PREFIX) or "dur" not in e:
            continue
        if (e.get("pid"), e.get("tid")) != (span.get("pid"), span.get("tid")):
            continue
        if start <= e["ts"] and e["ts"] + e["dur"] <= end + 1e-3 and name[len(LABEL_PREFIX):] in LABELLED:
            phases.append(Phase(name[len(LABEL_PREFIX):], (e["ts"] - start) * 1e-6, e["dur"] * 1e-6))
    return sorted(phases, key=lambda p: p.start_s)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.01 else f"{seconds * 1e3:.0f} ms"


def plot_step_timeline(trace: dict, step: int | None = None, ax: Axes | None = None, title: str = "") -> Axes:
    """One step of a trace as horizontal bars: the whole step, then one row per labelled category.

    A grey bar for the whole ``ProfilerStep#N``, then one row per category present (data loading, h2d, forward,
    backward, optimizer, sync, ...) with a bar per labelled phase; each row's label gives its total milliseconds,
    so a phase too short to see still reads off the axis."""
    span = pick_step(trace, step)
    phases = step_phases(trace, span)
    ax = ax or plt.subplots(figsize=(9, 2.6))[1]
    rows = [c for c in LABELLED if any(p.category == c for p in phases)]
    step_s = span["dur"] * 1e-6
    ax.barh(0, step_s * 1e3, left=0.0, color="0.8", edgecolor="0.4", lw=0.5)
    for p in phases:
        ax.barh(1 + rows.index(p.category), p.duration_s * 1e3, left=p.start_s * 1e3,
                color=CATEGORY_COLOURS.get(p.category, "C9"), edgecolor="k", lw=0.3)
    labels = [f"{span['name']}  {_ms(step_s)}"]
    labels += [f"{c}  {_ms(sum(p.duration_s for p in phases if p.category == c))}" for c in rows]
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set(xlabel="time from the step's start (ms)", title=title or f"one profiled step: {span['name']}")
    ax.set_xlim(0, step_s * 1e3 * 1.01)
    ax.invert_yaxis()
    return ax


def plot_step_timelines(traces: Mapping[str, dict], step: int | None = None) -> Figure:
    """One step of each named trace as a timeline, stacked on one shared time axis.

    Each is :func:`plot_step_timeline`; the shared axis makes a step that takes longer visibly longer."""
    if not traces:
        raise ValueError("no traces to draw")
    fig, axes = plt.subplots(len(traces), 1, figsize=(9, 1.9 * len(traces) + 0.6), sharex=True, squeeze=False)
    widest_ms = 0.0
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        plot_step_timeline(trace, step, ax=ax, title=name)
        widest_ms = max(widest_ms, ax.get_xlim()[1])
        if ax is not axes[-1, 0]:
            ax.set_xlabel("")
    axes[0, 0].set_xlim(0, widest_ms)
    fig.tight_layout()
    return fig
