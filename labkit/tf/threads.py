"""Thread-setting sweep for TensorFlow: its intra-/inter-op pools, on this machine.

Intra-op threads split *one* operator (a big matmul) across cores; inter-op threads run *independent*
operators at the same time. TensorFlow fixes both pools when it initialises, so each TF setting runs in
a fresh child process (which imports TensorFlow only, not PyTorch, to keep memory low; it times with the
same warm-up / repeat / median method as ``labkit.core.timing``). ``ThreadSweep`` is also the table of
PyTorch's sweep (``labkit.input.threads``); it lives here because this module must stay torch-free.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from labkit.core.clock import host_times_s, percentile
from labkit.core.machine import cpu_count
from labkit.core.procs import run_in_fresh_process
from labkit.core.validation import positive_ints

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes


@dataclass
class ThreadSweep:
    """Median time per call for each thread setting (a table and a plot)."""

    framework: str
    rows: list[dict]     # setting, intra, inter, median_s, p10_s, p90_s, speedup_vs_1
    cores: int
    workload: str

    def median_s(self, setting: str) -> float:
        """Median seconds per call under ``setting`` (a row's 'setting', e.g. '2 threads')."""
        for row in self.rows:
            if row["setting"] == setting:
                return row["median_s"]
        raise KeyError(f"no setting {setting!r}; have {[r['setting'] for r in self.rows]}")

    def best(self) -> dict:
        """The row with the lowest median time."""
        return min(self.rows, key=lambda r: r["median_s"])

    def to_dataframe(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame."""
        import pandas as pd  # lazy: every TensorFlow thread child imports this module and never builds a table

        return pd.DataFrame(self.rows).set_index("setting")

    def plot(self, ax: Axes | None = None) -> Axes:
        """Bar chart of the median milliseconds per call, one bar per setting."""
        import matplotlib.pyplot as plt  # lazy: TensorFlow children import this module and never plot (1.5 s each)

        ax = ax or plt.subplots(figsize=(6, 3))[1]
        ax.bar([r["setting"] for r in self.rows], [r["median_s"] * 1e3 for r in self.rows], color="tab:green")
        ax.set_ylabel("median ms per call")
        ax.set_title(f"{self.framework} threads on {self.cores} cores: {self.workload}")
        return ax


def add_speedups(rows: list[dict]) -> list[dict]:
    """Add ``speedup_vs_first`` to each row: the first setting's median time over this one's."""
    base = rows[0]["median_s"]
    for row in rows:
        row["speedup_vs_first"] = base / row["median_s"]
    return rows


def tf_thread_child(intra: int, inter: int, size: int, branches: int, warmup: int, repeats: int) -> dict:
    """Runs inside the child: configure TF's pools, then time ``branches`` independent matmuls."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    mats = [tf.random.stateless_normal((size, size), seed=(i, 0)) for i in range(branches + 1)]

    @tf.function
    def work():   # `branches` independent matmuls: intra-op splits each, inter-op runs them side by side
        return tf.add_n([tf.matmul(mats[0], m) for m in mats[1:]])

    times = host_times_s(lambda: work().numpy(), warmup=warmup, repeats=repeats)   # .numpy() waits for the result
    return {"median_s": statistics.median(times), "p10_s": percentile(times, 10), "p90_s": percentile(times, 90),
            "intra_seen": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_seen": tf.config.threading.get_inter_op_parallelism_threads()}


def sweep_tf_threads(settings: list[tuple[int, int]] | None = None, *, size: int = 384, branches: int = 4,
                     warmup: int = 2, repeats: int = 7, timeout_s: float = 120.0) -> ThreadSweep:
    """Time independent TF matmuls under each (intra, inter) setting, one fresh child process per setting."""
    cores = cpu_count()
    settings = [(1, 1), (cores, 1), (cores, cores)] if settings is None else settings
    if not settings:
        raise ValueError("settings must be a non-empty list of (intra, inter) pairs of positive integers")
    for pair in settings:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"each setting must be an (intra, inter) pair, got {pair!r}")
        positive_ints(pair, "each (intra, inter) setting")
    rows = []
    for intra, inter in settings:
        res = run_in_fresh_process("labkit.tf.threads:tf_thread_child", dict(
            intra=intra, inter=inter, size=size, branches=branches, warmup=warmup, repeats=repeats),
            timeout_s=timeout_s)
        res.pop("child_wall_s", None)
        rows.append({"setting": f"intra={intra} inter={inter}", "intra": intra, "inter": inter, **res})
    return ThreadSweep("tensorflow", add_speedups(rows), cores, f"{branches} independent {size}x{size} matmuls")
