"""What a profile says: time by category, top operators and memory of the recorded steps, and how two runs
compare (per-sample time by category, operators whose share of the time changed most).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labkit.profile.schedule import ProfileSchedule


@dataclass
class ProfileSummary:
    """What the profiled steps did: time by category, top operators, memory, and where the traces are."""

    run_dir: Path
    trace_files: list[Path]
    schedule: ProfileSchedule
    profiled_steps: int
    step_numbers: list[int]
    samples_per_step: int
    step_time_median_s: float
    category_s: dict[str, float]             # mean seconds per profiled step
    top_ops: list[dict]                      # name, self_cpu_s, self_device_s, calls (per profiled step)
    op_table: str                            # key_averages grouped by input shape, as text
    peak_mem_bytes: int | None
    item_calls_per_step: float
    device: str
    extras: dict = field(default_factory=dict)  # memory snapshot path, HTA results, gpu busy fraction

    @property
    def expected_steps(self) -> int:
        """Steps the schedule records (``profiled_steps`` should equal it)."""
        return self.schedule.profiled_steps

    def per_sample_s(self) -> dict[str, float]:
        """Seconds per training sample by category (and 'total')."""
        out = {c: s / self.samples_per_step for c, s in self.category_s.items()}
        out["total"] = self.step_time_median_s / self.samples_per_step
        return out

    def shares(self) -> dict[str, float]:
        """Fraction of step time per category (sums to 1)."""
        total = sum(self.category_s.values()) or 1.0
        return {c: s / total for c, s in self.category_s.items()}

    def __str__(self) -> str:
        cats = ", ".join(f"{c} {100 * f:.0f}%" for c, f in self.shares().items() if f >= 0.005)
        mem = "n/a" if self.peak_mem_bytes is None else f"{self.peak_mem_bytes / 2**20:.1f} MiB"
        return (f"{self.profiled_steps} profiled steps of {self.samples_per_step} samples on {self.device}: "
                f"median step {self.step_time_median_s * 1e3:.2f} ms "
                f"({self.step_time_median_s / self.samples_per_step * 1e3:.3f} ms/sample); {cats}; "
                f"peak memory during profiling {mem}; traces in {self.run_dir}")


def compare_runs(runs: dict[str, ProfileSummary]) -> pd.DataFrame:
    """Per-sample milliseconds by category, one column per run (a pandas DataFrame)."""
    if len(runs) < 2:
        raise ValueError(f"compare_runs needs two or more runs to compare, got {len(runs)}")
    table = {name: {c: s * 1e3 for c, s in summary.per_sample_s().items()} for name, summary in runs.items()}
    frame = pd.DataFrame(table)
    frame.index.name = "ms per sample"
    return frame


def changed_ops(a: ProfileSummary, b: ProfileSummary, top: int = 5) -> list[dict]:
    """Operators whose share of self time changed most from run ``a`` to run ``b``."""
    def shares(s: ProfileSummary) -> dict[str, float]:
        key = "self_device_s" if any(r["self_device_s"] for r in s.top_ops) else "self_cpu_s"
        total = sum(r[key] for r in s.top_ops) or 1.0
        return {r["name"]: r[key] / total for r in s.top_ops}

    sa, sb = shares(a), shares(b)
    rows = [{"op": k, "share_a": sa.get(k, 0.0), "share_b": sb.get(k, 0.0),
             "change": sb.get(k, 0.0) - sa.get(k, 0.0)} for k in set(sa) | set(sb)]
    return sorted(rows, key=lambda r: abs(r["change"]), reverse=True)[:top]
