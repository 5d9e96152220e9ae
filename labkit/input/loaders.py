"""PyTorch input-pipeline benchmarks: how DataLoader settings change samples/s and time spent waiting for data.

A training loop alternates "get the next batch" and "run the step". With ``num_workers=0`` the two
run one after the other; with worker processes the next batches are prepared *while* the step runs,
so the loop only waits when the workers fall behind. The benchmark records both phases per batch.

Beside the table sits the consumer's ceiling (:func:`measure_consumer_ceiling`): the same step run on batches
already in memory, so no loader at all. Every configuration is a fraction of it; the gap is what loading costs.
"""
from __future__ import annotations

import gc
import itertools
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch.utils.data import Dataset

from labkit.core.clock import host_times_s, now_s
from labkit.core.data import make_loader, validate_num_workers
from labkit.core.device import device_label
from labkit.core.machine import cpu_count
from labkit.core.progress import progress_bar
from labkit.core.validation import checked_int, positive_int
from labkit.training.ceiling import CEILING_REPEATS, POOL_BATCHES

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TRANSFORM_KINDS = ("io", "cpu")


@dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader knobs the sweep turns."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        validate_num_workers(self.num_workers)
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ValueError("prefetch_factor and persistent_workers need num_workers >= 1")
        checked_int(self.prefetch_factor, "prefetch_factor", allow_none=True)

    @property
    def label(self) -> str:
        """A short name for tables and plots, e.g. 'workers=2 pin prefetch=4'."""
        parts = [f"workers={self.num_workers}"]
        if self.pin_memory:
            parts.append("pin")
        if self.prefetch_factor is not None:
            parts.append(f"prefetch={self.prefetch_factor}")
        if self.persistent_workers:
            parts.append("persistent")
        return " ".join(parts)


class ExpensiveTransform:
    """Make each sample cost ``delay_s``: 'io' sleeps (slow disk/network: the core is free meanwhile),
    'cpu' spins (decode/augment: the core is busy). Picklable, so worker processes can run it."""

    def __init__(self, delay_s: float = 0.002, kind: str = "io") -> None:
        if kind not in TRANSFORM_KINDS:
            raise ValueError(f"kind must be one of {TRANSFORM_KINDS}, got {kind!r}")
        if not delay_s >= 0:
            raise ValueError(f"delay_s must be >= 0 seconds, got {delay_s!r}")
        self.delay_s, self.kind = float(delay_s), kind

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "io":
            time.sleep(self.delay_s)
            return x
        end = now_s() + self.delay_s
        acc = 0
        while now_s() < end:   # busy work in pure Python, holding its core like a decoder would
            acc += 1
        return x

    def __repr__(self) -> str:
        return f"ExpensiveTransform(delay_s={self.delay_s}, kind={self.kind!r})"


class TransformedDataset(Dataset):
    """Apply ``transform`` to the image of each ``(image, label)`` sample of ``base``."""

    def __init__(self, base: Dataset, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        x, y = self.base[i]
        return self.transform(x), y


def simulated_step(step_s: float) -> Callable[[object], None]:
    """A stand-in for an accelerator step: the host waits ``step_s`` while the device computes."""
    def step(batch: object) -> None:
        time.sleep(step_s)
    return step


@dataclass
class LoaderResult:
    """One benchmarked configuration."""

    config: LoaderConfig
    samples: int
    total_s: float
    wait_s: float
    timeline: list[tuple[float, float, float]] = field(repr=False)   # (wait start, batch ready, step end) in s

    @property
    def samples_per_s(self) -> float:
        """Samples per second over the whole run (worker start-up included)."""
        return self.samples / self.total_s

    @property
    def data_wait_fraction(self) -> float:
        """Fraction of the run spent waiting for the next batch."""
        return self.wait_s / self.total_s

    def row(self) -> dict:
        """The configuration and its results as one table row."""
        return {"config": self.config.label, **asdict(self.config), "samples_per_s": self.samples_per_s,
                "data_wait_fraction": self.data_wait_fraction, "total_s": self.total_s, "samples": self.samples}


def benchmark_loader(dataset: Dataset, config: LoaderConfig, *, batch_size: int = 32, epochs: int = 2,
                     step_fn: Callable[[object], None] | None = None, seed: int = 0) -> LoaderResult:
    """Run ``epochs`` passes (worker start-up included) and time data waits vs. steps."""
    positive_int(epochs, "epochs")
    step_fn = step_fn or (lambda batch: None)
    loader = make_loader(dataset, batch_size, shuffle=True, num_workers=config.num_workers,
                         pin_memory=config.pin_memory, prefetch_factor=config.prefetch_factor,
                         persistent_workers=config.persistent_workers, seed=seed)
    timeline, samples, wait_s = [], 0, 0.0
    start = now_s()
    for _ in range(epochs):
        it = iter(loader)   # starting workers is part of the wait, as in real training
        while True:
            t0 = now_s()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = now_s()
            step_fn(batch)
            t2 = now_s()
            wait_s += t1 - t0
            samples += len(batch[1])
            timeline.append((t0 - start, t1 - start, t2 - start))
        del it
    total_s = now_s() - start
    del loader
    gc.collect()   # shut worker processes down before the next configuration starts
    return LoaderResult(config, samples, total_s, wait_s, timeline)


@dataclass(frozen=True)
class ConsumerCeiling:
    """What the step alone reaches with every batch already in memory: the ceiling of a loader table."""

    samples_per_s: float                 # batch_size / median seconds of one step, fastest repeat
    step_time_s: float                   # that repeat's median seconds per step
    repeat_samples_per_s: tuple[float, ...]   # every repeat's samples/s


def measure_consumer_ceiling(step_fn: Callable[[object], None], batch_size: int, *, sample_from: Dataset,
                             steps: int = 10, repeats: int = CEILING_REPEATS) -> ConsumerCeiling:
    """Time ``step_fn`` on a few batches of ``sample_from`` loaded once and cycled -> ConsumerCeiling.

    The batches are built before the clock starts (no loader while timing); each repeat is one warm-up step
    and ``steps`` timed ones on the host clock (as :func:`benchmark_loader` times the step), and the fastest
    repeat's median step is the ceiling (an upper bound, so the best of the repeats).
    """
    batch_size = positive_int(batch_size, "batch_size", maximum=len(sample_from),
                              hint=f"sample_from has {len(sample_from)} samples")
    steps, repeats = positive_int(steps, "steps"), positive_int(repeats, "repeats")
    if not callable(step_fn):
        raise ValueError(f"step_fn must be a callable taking one batch, got {step_fn!r}")
    batches = iter(make_loader(sample_from, batch_size, shuffle=False, drop_last=True))
    pool = [next(batches) for _ in range(min(POOL_BATCHES, steps, len(sample_from) // batch_size))]
    cycle = itertools.cycle(pool)
    rates = [batch_size / statistics.median(host_times_s(lambda: step_fn(next(cycle)), warmup=1, repeats=steps))
             for _ in range(repeats)]
    best = max(rates)
    return ConsumerCeiling(best, batch_size / best, tuple(rates))


def default_grid(num_workers: int | None = None) -> list[LoaderConfig]:
    """A compact sweep: 0, 1 and ``num_workers`` (default: the cores) loader workers, then each knob on top."""
    n = num_workers or max(2, cpu_count())
    return [LoaderConfig(0), LoaderConfig(1), LoaderConfig(n), LoaderConfig(n, pin_memory=True),
            LoaderConfig(n, prefetch_factor=4), LoaderConfig(n, persistent_workers=True),
            LoaderConfig(n, pin_memory=True, prefetch_factor=4, persistent_workers=True)]


@dataclass
class LoaderSweep:
    """Results of a DataLoader sweep: a table and a plot."""

    results: list[LoaderResult]
    device: str
    ceiling: ConsumerCeiling | None = None     # the step on batches already in memory (None: not measured)

    @property
    def rows(self) -> list[dict]:
        """One table row per configuration (with ``fraction_of_ceiling`` when the ceiling was measured)."""
        if self.ceiling is None:
            return [r.row() for r in self.results]
        return [{**r.row(), "fraction_of_ceiling": r.samples_per_s / self.ceiling.samples_per_s}
                for r in self.results]

    def by_label(self) -> dict[str, LoaderResult]:
        """The results keyed by their configuration's label."""
        return {r.config.label: r for r in self.results}

    def to_dataframe(self) -> pd.DataFrame:
        """samples/s, data-wait fraction, total seconds (and fraction of the ceiling) per configuration."""
        columns = ["samples_per_s", "data_wait_fraction", "total_s"]
        columns += ["fraction_of_ceiling"] if self.ceiling is not None else []
        return pd.DataFrame(self.rows).set_index("config")[columns]

    def plot(self, ax: Axes | None = None) -> Axes:
        """Bar chart of samples/s, annotated with the data-wait fraction."""
        ax = ax or plt.subplots(figsize=(8, 3.2))[1]
        labels = [r.config.label for r in self.results]
        bars = ax.barh(labels, [r.samples_per_s for r in self.results], color="tab:blue")
        for bar, r in zip(bars, self.results):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                    f" wait {100 * r.data_wait_fraction:.0f}%", va="center", fontsize=8)
        if self.ceiling is not None:
            ax.axvline(self.ceiling.samples_per_s, ls="--", color="grey", label="ceiling: the step alone")
            ax.legend(loc="upper right", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("samples/s")
        ax.set_title(f"DataLoader sweep on {self.device}")
        return ax


def sweep_loaders(dataset: Dataset, configs: list[LoaderConfig] | None = None, *, batch_size: int = 32,
                  epochs: int = 2, step_fn: Callable[[object], None] | None = None, seed: int = 0,
                  progress: bool = True, ceiling: bool = False) -> LoaderSweep:
    """Benchmark each DataLoader configuration on the same dataset and step (``ceiling=True``: and the step alone)."""
    configs = configs or default_grid()
    if ceiling and step_fn is None:
        raise ValueError("ceiling=True needs step_fn: the ceiling is what that step reaches with the data in memory")
    results = [benchmark_loader(dataset, c, batch_size=batch_size, epochs=epochs, step_fn=step_fn, seed=seed)
               for c in progress_bar(configs, desc="DataLoader sweep", unit="config", enabled=progress)]
    top = measure_consumer_ceiling(step_fn, batch_size, sample_from=dataset) if ceiling else None
    return LoaderSweep(results, device_label("cpu"), top)


def plot_overlap(results: list[LoaderResult], max_batches: int = 8, ax: Axes | None = None) -> Axes:
    """Gantt chart of waiting for data (red) and stepping (blue), one row per configuration."""
    ax = ax or plt.subplots(figsize=(9, 1 + 0.6 * len(results)))[1]
    for row, res in enumerate(results):
        for t0, t1, t2 in res.timeline[:max_batches]:
            ax.barh(row, t1 - t0, left=t0, color="tab:red", height=0.5)
            ax.barh(row, t2 - t1, left=t1, color="tab:blue", height=0.5)
    ax.set_yticks(range(len(results)), [r.config.label for r in results])
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds (first {max_batches} batches; red = waiting for data, blue = training step)")
    return ax
