"""The tuning ladder's result: one row per rung, as a Markdown table, JSON, and a bar chart of speedups
with the accuracy beside it; where the rungs were timed to a target accuracy
(:mod:`labkit.ladder.first_to_target`), each rung's time to it and the rung that reached it first."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import pandas as pd

from labkit.core.results import atomic_write_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MEASURED = ("baseline", "faster", "slower", "no clear gain")   # statuses that carry numbers


@dataclass(frozen=True)
class LadderRow:
    """One rung: what changed, what it measured, its speedups and whether it was carried forward."""

    rung: int
    key: str
    title: str
    what_changed: str
    explanation: str
    notebook: str
    status: str                       # baseline | faster | slower | no clear gain | not applicable here |
    #                                   unsupported here (tried and failed) | skipped
    reason: str
    kept: bool                        # carried into the following rungs
    compared_to: int | None           # the rung whose recipe this one was added to
    batch_size: int | None = None     # per process
    world_size: int | None = None
    lr: float | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    peak_mem_bytes: int | None = None
    data_wait_fraction: float | None = None
    math_mode: str | None = None      # arithmetic the convolutions ran in: fp32 (strict) | tf32 | bf16 | fp16
    mfu: float | None = None          # against the peak of math_mode on this GPU
    val_accuracy: float | None = None
    startup_s: float | None = None    # one-off cost (compile, workers, processes), excluded from throughput
    samples_trained: int | None = None
    speedup_cumulative: float | None = None   # samples_per_s / rung 0's
    speedup_rung: float | None = None         # samples_per_s / the compared_to rung's
    accuracy_ok: bool | None = None           # accuracy within the tolerance of rung 0's (None: not measured)
    recipe: dict | None = None                # the measured Recipe's fields
    fraction_of_ceiling: float | None = None  # samples/s per process / the hardware ceiling's
    to_target_status: str | None = None       # reached | missed | not timed (None: no to-target phase ran)
    time_to_target_s: float | None = None     # olympic mean of the seeds; None unless reached
    to_target_seconds: list | None = None     # per seed, None where that seed missed
    to_target_steps: list | None = None       # optimizer steps per seed (set by the seed), None where missed
    to_target_note: str = ""

    @property
    def measured(self) -> bool:
        return self.status in MEASURED


@dataclass
class LadderResult:
    """The ladder's table plus the context every number needs (device, mode, model, data, budget)."""

    rows: list[LadderRow]
    device: str
    mode: str
    model: str
    dataset: str
    budget_samples: int
    batch_probe: dict = field(default_factory=dict)   # candidate batch -> samples/s (rung 1's choice)
    notes: list[str] = field(default_factory=list)
    ceiling_samples_per_s: float | None = None       # training batches already on the device, best recipe
    ceiling_note: str = "not measured"
    to_target: dict | None = None                    # target, its source, the first rung (first_to_target.summary)

    def rung(self, index: int) -> LadderRow:
        """The row of rung ``index``."""
        return next(r for r in self.rows if r.rung == index)

    @property
    def best(self) -> LadderRow:
        """The fastest measured rung whose accuracy stayed within the tolerance of rung 0's."""
        return max((r for r in self.rows if r.measured and r.accuracy_ok is not False), key=lambda r: r.samples_per_s)

    def header(self) -> str:
        """Hardware, mode, job and budget, printed above the table."""
        return (f"Device: {self.device}\nMode: {self.mode}\nJob: {self.model} on {self.dataset}; "
                f"fixed budget {self.budget_samples} training samples per rung\n"
                f"Ceiling: {_fmt(self.ceiling_samples_per_s, '{:.1f}') or 'n/a'} samples/s ({self.ceiling_note})"
                + self.target_header())

    def target_header(self) -> str:
        """The target, its source and the first rung to reach it ("" where the rungs were not timed to one)."""
        t = self.to_target
        if not t:
            return ""
        return (f"\nTarget: {t['target_accuracy']:.1%} validation accuracy ({t['target_source']}); "
                f"{len(t['seeds'])} seeds, at most {t['max_epochs']} epochs each, checked {t['evals_per_epoch']} "
                f"times an epoch; {_fmt(t.get('wall_s'), '{:.0f}') or '?'} s in all; "
                f"this process got {t['cpu_share']:.2f} of the CPU it wanted\n"
                f"First to the target: {t['verdict']}" + ("" if t["fastest_per_sample_rung"] is None else
                                                          f" (fastest per sample: rung {t['fastest_per_sample_rung']})"))

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return {"device": self.device, "mode": self.mode, "model": self.model, "dataset": self.dataset,
                "budget_samples": self.budget_samples, "notes": self.notes,
                "ceiling_samples_per_s": self.ceiling_samples_per_s, "ceiling_note": self.ceiling_note,
                "batch_probe": {str(k): v for k, v in self.batch_probe.items()}, "to_target": self.to_target,
                "rows": [asdict(r) for r in self.rows]}

    def to_json(self, indent: int = 2) -> str:
        """The table as JSON (NaN/inf written as null)."""
        return json.dumps(_finite(self.to_dict()), indent=indent)

    def to_markdown(self, link_base: str = "") -> str:
        """The table as Markdown, hardware and mode above it; notebook links prefixed by ``link_base``."""
        cols = ("rung", "what changed", "batch (global)", "samples/s", "step time (ms)", "peak mem (MB)",
                "data wait", "math", "MFU", "of ceiling", "val acc", "start-up (s)", "speedup total", "speedup rung",
                *(("to target (s)",) if self.to_target else ()), "status")
        lines = ["\n".join(f"{line}  " for line in self.header().splitlines()), "",
                 "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in self.rows:
            name = f"{r.rung}. [{r.title}]({link_base}{r.notebook})"
            batch = f"{r.batch_size * r.world_size}" if r.batch_size and r.world_size else ""
            status = r.status + ("" if r.kept or r.status == "baseline" else f": {r.reason}")
            cells = (name, r.what_changed, batch, _fmt(r.samples_per_s, "{:.1f}"),
                     _fmt(r.step_time_s, "{:.2f}", 1e3), _fmt(r.peak_mem_bytes, "{:.0f}", 1 / 2**20),
                     _fmt(r.data_wait_fraction, "{:.0%}"), r.math_mode or "", _fmt(r.mfu, "{:.1%}"),
                     _fmt(r.fraction_of_ceiling, "{:.0%}"), _fmt(r.val_accuracy, "{:.1%}"),
                     _fmt(r.startup_s, "{:.1f}"), _fmt(r.speedup_cumulative, "{:.2f}x"),
                     _fmt(r.speedup_rung, "{:.2f}x"),
                     *((_target_cell(r),) if self.to_target else ()), status)
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        missed = [f"rung {r.rung} to the target: {r.to_target_note}" for r in self.rows
                  if r.to_target_status == "missed" or (r.to_target_status == "not timed" and r.measured)]
        return "\n".join(lines + [""] + [f"- {n}" for n in [*missed, *self.notes]])

    def to_dataframe(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame (needs pandas)."""
        return pd.DataFrame([asdict(r) for r in self.rows]).set_index("rung")

    @classmethod
    def from_dict(cls, doc: dict) -> LadderResult:
        """The result back from :meth:`to_dict` / ``ladder.json`` (reports are rendered from saved runs)."""
        rows = [LadderRow(**row) for row in doc["rows"]]
        probe = {int(k): v for k, v in doc.get("batch_probe", {}).items()}
        return cls(rows, doc["device"], doc["mode"], doc["model"], doc["dataset"], doc["budget_samples"], probe,
                   list(doc.get("notes", [])), doc.get("ceiling_samples_per_s"),
                   doc.get("ceiling_note", "not measured"), doc.get("to_target"))

    def save(self, out_dir: str | Path) -> tuple[Path, Path]:
        """Write ``ladder.json`` and ``ladder.md`` into ``out_dir``; returns both paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "ladder.json", self.to_json())       # a reader sees the old file or the new one
        atomic_write_text(out / "ladder.md", self.to_markdown(link_base="notebooks/"))
        return out / "ladder.json", out / "ladder.md"

    def plot(self) -> Figure:
        """Bar chart of cumulative and per-rung speedup (log scale), with validation accuracy beside it."""
        labels = [f"{r.rung}. {r.title}" for r in self.rows]
        ys = range(len(self.rows))
        fig, (ax, ax_acc) = plt.subplots(1, 2, figsize=(11, 0.5 * len(self.rows) + 1.5), sharey=True,
                                         gridspec_kw={"width_ratios": [3, 1]})
        h = 0.38
        total = [r.speedup_cumulative or math.nan for r in self.rows]
        rung = [r.speedup_rung or math.nan for r in self.rows]
        ax.barh([y - h / 2 for y in ys], total, h, label="speedup over rung 0 (cumulative)", color="tab:blue")
        ax.barh([y + h / 2 for y in ys], rung, h, label="speedup of this rung", color="tab:orange")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        for y, r in zip(ys, self.rows):
            if not r.measured:
                ax.text(1.0, y, f"  {r.status}", va="center", fontsize=8, color="gray")
            elif not r.kept and r.status != "baseline":
                ax.text(max(total[y], rung[y]), y, "  not carried", va="center", fontsize=8, color="gray")
        ax.set_yticks(list(ys), labels)
        ax.invert_yaxis()
        ax.set_xlabel("speedup (x, log scale)")
        ax.set_title(f"Tuning ladder on {self.device}")
        ax.legend(loc="lower right", fontsize=8)
        accs = [100 * r.val_accuracy if r.val_accuracy is not None else math.nan for r in self.rows]
        ax_acc.barh(list(ys), accs, color="tab:green")
        finite = [a for a in accs if math.isfinite(a)]
        if finite:
            ax_acc.set_xlim(max(0.0, min(finite) - 5), 100)
        ax_acc.set_xlabel("val accuracy (%) after the budget")
        fig.tight_layout()
        return fig


def _target_cell(row: LadderRow) -> str:
    if not row.measured:
        return ""
    if row.to_target_status == "reached":
        return f"{row.time_to_target_s:.2f}"
    return row.to_target_status or ""          # missed | not timed: never a number


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return spec.format(value * scale)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
