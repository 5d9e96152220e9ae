"""What the batch-size dashboard draws: memory bars against the device, curves by samples and seconds, a table.

Plain functions of :class:`labkit.ui.batch_runs.DashboardRun` lists, returning HTML strings and PNG bytes, so
they are tested without a browser. Matplotlib's object API (no pyplot) keeps drawing safe off the main thread.
"""
from __future__ import annotations

import html
import io
import statistics
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from labkit.ui.batch_limits import BatchLimit
from labkit.ui.batch_runs import DashboardRun, results_table, spread_warnings

PARTS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52", "activations": "#8172b2",
         "temporaries": "#ccb974"}      # temporaries: the step's peak above the parts (gradient buffers, workspaces)
BAR_PX = 520
SMOOTH_STEPS = 5        # the throughput curve is a running median over this many steps (as is the readout)
RUN_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
              "#17becf")


def run_color(index: int) -> str:
    """The colour of run ``index`` (0-based) in every plot and bar."""
    return RUN_COLORS[index % len(RUN_COLORS)]


@dataclass(frozen=True)
class BarGeometry:
    """One run's memory bar in pixels: segments (part, left, width), where the predicted peak ends, the ticks."""

    segments: tuple[tuple[str, float, float], ...]
    predicted_end_px: float
    measured_px: float | None
    reserve_px: tuple[float, float] | None      # (left, width) of the allocator's reserve (GPU)
    usable_px: float


def bar_geometry(run: DashboardRun, limit: BatchLimit, width_px: float = BAR_PX) -> BarGeometry:
    """Lay the predicted parts end to end up to the predicted peak (a peak below their sum clips the last ones)."""
    mem = run.memory
    px = lambda b: round(width_px * b / limit.capacity_bytes, 2)    # noqa: E731
    extra = mem.peak_adjust_bytes + mem.workspace_bytes
    sizes = {"params": mem.params_bytes, "grads": mem.grads_bytes, "optimizer": mem.optimizer_bytes,
             "activations": mem.activations_bytes, "temporaries": max(0, extra)}
    end, left, segments = px(mem.total_bytes), 0.0, []
    for part, size in sizes.items():
        width = min(px(size), max(0.0, end - left))
        if width > 0:
            segments.append((part, left, width))
        left += width
    measured = px(run.measured_bytes) if run.measured_bytes else None
    reserve = (measured, px(run.reserved_bytes)) if measured is not None and run.reserved_bytes else None
    return BarGeometry(tuple(segments), end, measured, reserve, px(limit.usable_bytes))


def _bar_html(run: DashboardRun, index: int, limit: BatchLimit) -> str:
    geo = bar_geometry(run, limit)
    parts = run.memory.as_dict_mb()
    divs = [f'<div title="{p} {parts.get(p, 0):.1f} MB" style="position:absolute;left:{x}px;width:{w}px;top:0;'
            f'height:14px;background:{PARTS[p]}"></div>' for p, x, w in geo.segments]
    if geo.reserve_px:
        divs.append(f'<div title="allocator reserve" style="position:absolute;left:{geo.reserve_px[0]}px;'
                    f'width:{geo.reserve_px[1]}px;top:3px;height:8px;background:repeating-linear-gradient(45deg,'
                    '#999 0 2px,transparent 2px 4px)"></div>')
    if geo.measured_px is not None:
        divs.append(f'<div class="labkit-measured-tick" title="measured" style="position:absolute;'
                    f'left:{geo.measured_px - 1:.2f}px;width:2px;top:-3px;height:20px;background:black"></div>')
    divs.append(f'<div title="usable" style="position:absolute;left:{geo.usable_px}px;top:-3px;height:20px;'
                'border-left:2px dashed #c44e52"></div>')
    meas = f", measured {run.measured_bytes / 1e6:.1f} MB" if run.measured_bytes else ""
    reserve = f", allocator reserve {run.reserved_bytes / 1e6:.1f} MB" if run.reserved_bytes else ""
    share = 100 * run.memory.total_bytes / limit.capacity_bytes
    return (f'<div style="font-size:11px;margin-top:4px"><span style="color:{run_color(index)}">&#9632;</span> '
            f'#{index + 1} {html.escape(run.label)}: predicted {parts["total"]:.1f} MB{meas}{reserve} '
            f'({share:.1f}% of the {limit.capacity_label})</div>'
            f'<div class="labkit-memory-bar" style="position:relative;width:{BAR_PX}px;height:14px;'
            f'outline:1px solid #888;background:#f4f4f4">{"".join(divs)}</div>')


def memory_bars_html(runs: list[DashboardRun], limit: BatchLimit | None) -> str:
    """Stacked bars per run drawn to the device's scale: the box is the capacity, the dashed line what is usable."""
    sized = [(i, r) for i, r in enumerate(runs) if r.memory is not None]
    if not sized or limit is None:
        return "<i>memory: waiting for the first run</i>"
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {k}' for k, c in PARTS.items())
    head = (f'<b>Memory</b> against the {limit.capacity_label} ({limit.capacity_bytes / 1e6:,.0f} MB, the whole '
            f'box; red dashes: usable {limit.usable_bytes / 1e6:,.0f} MB after the safety margin)<br>{legend}; '
            'black tick = measured peak' + ("; hatched = allocator reserve" if limit.device_kind == "cuda" else
                                            " (CPU: fixed parts + activations counted from the autograd graph)"))
    return (f'<div class="labkit-memory" style="max-width:{BAR_PX + 260}px">{head}'
            + "".join(_bar_html(r, i, limit) for i, r in sized[-6:]) + "</div>")


def _plot_run(axes, run: DashboardRun, index: int) -> None:
    color, label = run_color(index), f"#{index + 1} {run.label}"
    ax_acc_n, ax_acc_s, ax_loss, ax_tput = axes
    if run.accuracy:
        ax_acc_n.plot([a["samples_seen"] for a in run.accuracy], [a["accuracy"] for a in run.accuracy],
                      marker="o", color=color, label=label)
        ax_acc_s.plot([a["train_s"] for a in run.accuracy], [a["accuracy"] for a in run.accuracy],
                      marker="o", color=color, label=label)
    if run.points:
        seen = [p["samples_seen"] for p in run.points]
        ax_loss.plot(seen, [p["loss"] for p in run.points], color=color, label=label, lw=1)
        ax_tput.plot(seen, rolling_median([p["samples_per_s"] for p in run.points]), color=color, label=label, lw=1)
    if run.ceiling_samples_per_s:
        ax_tput.axhline(run.ceiling_samples_per_s, color=color, ls="--", lw=1)


def rolling_median(values: list[float], window: int = SMOOTH_STEPS) -> list[float]:
    """Median of each value and the ``window - 1`` before it: per-step rates on a busy CPU jump 2-3x."""
    return [statistics.median(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def curves_png(runs: list[DashboardRun], target: float | None = None) -> bytes:
    """Accuracy by samples seen and by training seconds, loss and throughput (ceilings dashed), one PNG."""
    fig = Figure(figsize=(9, 5), dpi=72)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2).ravel()
    for i, run in enumerate(runs):
        _plot_run(axes, run, i)
    for ax in axes[:2]:
        ax.set_ylim(0, 1)
        if target is not None:
            ax.axhline(target, color="grey", ls=":", lw=1)
    axes[0].set(xlabel="samples seen", ylabel="val accuracy", title="accuracy by samples seen")
    axes[1].set(xlabel="training time (s, evaluation excluded)", ylabel="val accuracy",
                title="accuracy by time" + (f" (dotted: target {target:.2f})" if target is not None else ""))
    axes[2].set(xlabel="samples seen", ylabel="training loss", title="loss")
    axes[3].set(xlabel="samples seen", title="throughput (dashed: device-resident ceiling)")
    axes[3].set_ylabel(f"samples/s (median of {SMOOTH_STEPS} steps)")
    if any(r.points for r in runs):
        axes[2].legend(fontsize=7, loc="upper right")
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.1, top=0.94, hspace=0.45, wspace=0.25)  # tight_layout: 2x the cost
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _number(value: float) -> str:
    """Table numbers: thousands with separators, small ones with three significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def results_html(runs: list[DashboardRun], target: float) -> str:
    """The results table (units in the headers) and any warning about repeats that disagree."""
    if not runs:
        return ""
    table = results_table(runs, target).astype(object)
    cells = table.map(lambda v: "-" if v is None or v != v else _number(v) if isinstance(v, float) else v)
    html_table = cells.to_html(index=False, border=0, classes="labkit-results-table")
    warnings = "".join(f'<div style="color:#c44e52"><b>spread between repeats:</b> {html.escape(w)}</div>'
                       for w in spread_warnings(runs))
    return (f'<div style="font-size:11px"><b>Results</b> (samples/s: median and p10-p90 of the steps after '
            f'warm-up; MB: 10<sup>6</sup> bytes; s_to / samples_to: training seconds and samples to reach '
            f'val accuracy {target:.2f}; every run seeded){html_table}{warnings}</div>')
