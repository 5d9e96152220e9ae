"""tf.data orderings from the TensorFlow guide "Better performance with the tf.data API"
(https://www.tensorflow.org/guide/data_performance), each measured live on this machine.

Slow storage and a busy accelerator are *simulated* with sleeps, as the guide itself does: a sleep
stands for time the host spends waiting (a remote disk, a GPU step) while its cores stay free.
Parsing/normalisation is real TensorFlow work. TensorFlow is imported lazily.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from labkit.core.clock import host_times_s, now_s
from labkit.core.validation import checked_int, positive_int

if TYPE_CHECKING:
    import tensorflow as tf
    from matplotlib.axes import Axes

    from labkit.core.data import ImageData


def _tf():
    import tensorflow as tf

    return tf


def _as_written(fn):
    """``fn`` traced as written, without AutoGraph. These functions have no Python control flow on tensors, and
    AutoGraph writes each function it converts to a file in /tmp that only a clean interpreter exit deletes: a
    kernel that nbval or a restart kills leaves them behind."""
    return _tf().autograph.experimental.do_not_convert(fn)


@dataclass
class Comparison:
    """One experiment: variants with their timings (a table and a plot)."""

    name: str
    rows: list[dict]
    note: str = ""
    extra: dict = field(default_factory=dict)

    def __getitem__(self, variant: str) -> dict:
        for row in self.rows:
            if row["variant"] == variant:
                return row
        raise KeyError(f"no variant {variant!r} in {self.name}; have {[r['variant'] for r in self.rows]}")

    def to_dataframe(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame."""
        return pd.DataFrame(self.rows).set_index("variant")

    def plot(self, ax: Axes | None = None, key: str = "samples_per_s") -> Axes:
        """Horizontal bars of ``key`` (default samples/s), one per variant."""
        ax = ax or plt.subplots(figsize=(6, 0.5 + 0.5 * len(self.rows)))[1]
        ax.barh([r["variant"] for r in self.rows], [r[key] for r in self.rows], color="tab:orange")
        ax.invert_yaxis()
        ax.set_xlabel(key.replace("_", " ").replace("per s", "/s"))
        ax.set_title(self.name)
        return ax


def _check_images(images: np.ndarray) -> np.ndarray:
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4 or len(images) < 2:
        raise ValueError("images must be a uint8 NumPy array (N, H, W, C) with N >= 2, "
                         f"got {type(images).__name__} {getattr(images, 'dtype', '')} {getattr(images, 'shape', '')}")
    return images


def images_from(data: ImageData, limit: int | None = None) -> np.ndarray:
    """uint8 (N, H, W, C) images from a ``labkit.core.data.load_data`` result, for tf.data experiments."""
    images = data.train.images[:limit].permute(0, 2, 3, 1).contiguous().numpy()   # (N, C, H, W) -> (N, H, W, C)
    return _check_images(images)


def parse(x: tf.Tensor, mean: float = 0.5, std: float = 0.25) -> tf.Tensor:
    """A vectorisable parse, works at any batch rank: uint8 -> float in [0, 1] -> standardised."""
    tf = _tf()
    x = tf.cast(x, tf.float32) * (1.0 / 255.0)
    return (x - mean) / std


def _median_s(fn, *, warmup: int, repeats: int) -> float:
    """Median seconds per call of ``fn`` on the host clock (TensorFlow's CPU work is done when it returns)."""
    return statistics.median(host_times_s(fn, warmup=warmup, repeats=repeats))


def _drain(ds) -> int:
    n = 0
    for batch in ds:
        n += int(batch.shape[0]) if batch.shape.rank else 1
    return n


def map_vs_batch(images: np.ndarray, batch_size: int = 32, repeats: int = 3, epochs: int = 8) -> Comparison:
    """Guide 'Vectorizing mapping': map-then-batch calls ``parse`` per sample, batch-then-map per batch."""
    tf, images = _tf(), _check_images(images)
    positive_int(batch_size, "batch_size")
    positive_int(epochs, "epochs")
    n = len(images) * epochs   # enough elements that per-element cost, not iterator start-up, dominates
    base = tf.data.Dataset.from_tensor_slices(images).repeat(epochs)
    variants = {"map then batch": base.map(_as_written(parse)).batch(batch_size),
                "batch then map (vectorised)": base.batch(batch_size).map(_as_written(parse))}
    first = [next(iter(ds)).numpy() for ds in variants.values()]
    if not np.allclose(first[0], first[1], atol=1e-5):
        raise AssertionError("the two orderings must produce the same batches")
    rows = []
    for name, ds in variants.items():
        seconds = _median_s(lambda ds=ds: _drain(ds), warmup=1, repeats=repeats)
        rows.append({"variant": name, "seconds": seconds, "samples_per_s": n / seconds})
    return Comparison("map then batch vs batch then map", rows,
                      "same output, one parse call per batch instead of per sample")


def sleep_op(x: tf.Tensor, seconds: float) -> tf.Tensor:
    """Pass ``x`` through after a host sleep of ``seconds`` (simulated I/O or decode latency)."""
    tf = _tf()

    def wait(v):
        time.sleep(seconds)
        return v

    y = tf.py_function(wait, [x], x.dtype)
    y.set_shape(x.shape)
    return y


def cache_and_shuffle(images: np.ndarray, decode_s: float = 0.002, seed: int = 0) -> Comparison:
    """Guide 'Caching': where ``cache`` sits decides what epoch 2 pays, what it remembers, and its memory."""
    tf, images = _tf(), _check_images(images)
    base = tf.data.Dataset.from_tensor_slices((np.arange(len(images)), images))

    @_as_written
    def decode(i, x):
        return i, parse(sleep_op(x, decode_s))

    n = len(images)
    variants = {
        "no cache": (base.map(decode).shuffle(n, seed=seed), 0),
        "cache raw, then decode": (base.cache().map(decode).shuffle(n, seed=seed), images.nbytes),
        "decode, cache, then shuffle": (base.map(decode).cache().shuffle(n, seed=seed), images.size * 4),
        "decode, shuffle, then cache": (base.map(decode).shuffle(n, seed=seed).cache(), images.size * 4),
    }
    rows = []
    for name, (ds, cache_bytes) in variants.items():
        epochs = []
        for _ in range(2):
            start = now_s()
            order = [int(i) for i, _ in ds]
            epochs.append((now_s() - start, order))
        rows.append({"variant": name, "epoch1_s": epochs[0][0], "epoch2_s": epochs[1][0],
                     "samples_per_s": n / epochs[1][0], "cache_mb": cache_bytes / 2**20,
                     "epoch2_reshuffled": epochs[0][1] != epochs[1][1]})
    return Comparison("cache placement (epoch 2)", rows, f"decode simulated as {decode_s * 1e3:.1f} ms per image")


def prefetch_overlap(n: int = 32, read_s: float = 0.01, step_s: float = 0.01, repeats: int = 3) -> Comparison:
    """Guide 'Prefetching': with ``prefetch(AUTOTUNE)`` reading the next element overlaps the step."""
    tf = _tf()
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False   # TF would otherwise add a prefetch by itself
    @_as_written
    def read(i):
        return sleep_op(i, read_s)

    base = tf.data.Dataset.range(n).map(read).with_options(options)

    def train(ds) -> None:
        for _ in ds:
            time.sleep(step_s)   # the simulated training step

    rows = []
    for name, ds in {"no prefetch": base, "prefetch(AUTOTUNE)": base.prefetch(tf.data.AUTOTUNE)}.items():
        seconds = _median_s(lambda ds=ds: train(ds), warmup=0, repeats=repeats)
        rows.append({"variant": name, "seconds": seconds, "samples_per_s": n / seconds})
    return Comparison("prefetch", rows, f"read {read_s * 1e3:.0f} ms + step {step_s * 1e3:.0f} ms per element "
                      "(simulated)", {"serial_s": n * (read_s + step_s), "overlapped_s": n * max(read_s, step_s)})


def parallel_map(n: int = 32, decode_s: float = 0.01, parallel: int | None = None, repeats: int = 3) -> Comparison:
    """Guide 'Parallelizing data transformation': ``num_parallel_calls`` runs several decodes at once."""
    tf = _tf()
    parallel = parallel or tf.data.AUTOTUNE
    base = tf.data.Dataset.range(n)

    @_as_written
    def decode(i):
        return sleep_op(i, decode_s)

    rows = []
    for name, calls in (("num_parallel_calls=None", None), (f"num_parallel_calls={_name(parallel)}", parallel)):
        ds = base.map(decode, num_parallel_calls=calls)
        seconds = _median_s(lambda ds=ds: _drain(ds), warmup=0, repeats=repeats)
        rows.append({"variant": name, "seconds": seconds, "samples_per_s": n / seconds})
    return Comparison("parallel map", rows, f"decode simulated as {decode_s * 1e3:.0f} ms per element")


def _name(parallel: int) -> str:
    return "AUTOTUNE" if parallel == _tf().data.AUTOTUNE else str(parallel)


def write_shards(images: np.ndarray, directory: str | Path, num_files: int = 8) -> list[str]:
    """Write ``images`` into ``num_files`` real TFRecord files (one serialised image per record)."""
    tf, images = _tf(), _check_images(images)
    positive_int(num_files, "num_files", maximum=len(images), hint=f"{len(images)} images, at least one per file")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, part in enumerate(np.array_split(images, num_files)):
        path = str(directory / f"shard-{k:03d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for img in part:
                writer.write(img.tobytes())
        paths.append(path)
    return paths


def interleave_files(paths: list[str], record_s: float = 0.002, cycle_length: int = 4, repeats: int = 2) -> Comparison:
    """Guide 'Parallelizing data extraction': read several files at once with ``interleave``."""
    tf = _tf()
    if not paths:
        raise ValueError("paths is empty; write some files first with write_shards(...)")
    files = tf.data.Dataset.from_tensor_slices(paths)

    @_as_written
    def slow(record):
        return sleep_op(record, record_s)

    @_as_written
    def read(path):   # remote storage simulated as a latency per record
        return tf.data.TFRecordDataset(path).map(slow)

    variants = {"one file at a time": files.interleave(read, cycle_length=1),
                f"interleave x{cycle_length}, parallel": files.interleave(
                    read, cycle_length=cycle_length, num_parallel_calls=tf.data.AUTOTUNE)}
    rows = []
    for name, ds in variants.items():
        count = sum(1 for _ in ds)
        seconds = _median_s(lambda ds=ds: sum(1 for _ in ds), warmup=0, repeats=repeats)
        rows.append({"variant": name, "seconds": seconds, "samples_per_s": count / seconds, "records": count})
    return Comparison("reading many files", rows, f"{record_s * 1e3:.0f} ms simulated latency per record")


def shard_order(n: int = 64, world_size: int = 2, decode_s: float = 0.002) -> Comparison:
    """Guide/tf.distribute advice: ``shard`` before heavy work, so each worker decodes only its own part."""
    tf = _tf()
    checked_int(world_size, "world_size", minimum=2, hint="sharding needs two or more workers")
    calls = {"n": 0}

    @_as_written
    def decode(i):
        def work(v):
            calls["n"] += 1
            time.sleep(decode_s)
            return v
        return tf.py_function(work, [i], i.dtype)

    rows = []
    for name in ("map then shard", "shard then map"):
        calls["n"], start, seen = 0, now_s(), 0
        for w in range(world_size):   # each simulated worker reads its own shard
            base = tf.data.Dataset.range(n)
            ds = base.map(decode).shard(world_size, w) if name == "map then shard" else \
                base.shard(world_size, w).map(decode)
            seen += sum(1 for _ in ds)
        total = now_s() - start
        rows.append({"variant": name, "decode_calls": calls["n"], "samples": seen,
                     "seconds_per_worker": total / world_size, "samples_per_s": seen / total})
    return Comparison("shard placement", rows, f"{world_size} simulated workers, one after another")


def cache_repeat_order(images: np.ndarray, epochs: int = 3, cache_dir: str | Path | None = None) -> Comparison:
    """``cache().repeat(k)`` vs ``repeat(k).cache()``: decode work per epoch and what the cache holds.

    ``cache`` stores the elements of the dataset *in front of it*. Before ``repeat`` that is one epoch,
    decoded once and replayed; after ``repeat`` it is every repetition, so the work is redone each epoch and the
    cache grows with the epochs (with an endless ``repeat()`` it never completes). The caches are written to
    files here so their size can be measured exactly; an in-memory cache holds the same elements.
    """
    tf, images = _tf(), _check_images(images)
    checked_int(epochs, "epochs", minimum=2, hint="comparing the orderings needs two or more epochs")
    calls = {"n": 0}

    @_as_written
    def counted_parse(x):
        def work(v):
            calls["n"] += 1
            return parse(v)
        return tf.py_function(work, [x], tf.float32)

    rows = []
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        for name in ("cache then repeat", "repeat then cache"):
            calls["n"], path = 0, str(Path(tmp) / name.replace(" ", "_"))
            base = tf.data.Dataset.from_tensor_slices(images).map(counted_parse)
            ds = base.cache(path).repeat(epochs) if name == "cache then repeat" else base.repeat(epochs).cache(path)
            seen = sum(1 for _ in ds)
            cache_bytes = sum(p.stat().st_size for p in Path(tmp).glob(Path(path).name + "*"))
            rows.append({"variant": name, "epochs": epochs, "elements_seen": seen, "decode_calls": calls["n"],
                         "decode_calls_per_epoch": calls["n"] / epochs, "cache_bytes": cache_bytes})
    return Comparison("cache and repeat", rows, f"{len(images)} images, {epochs} epochs, file caches",
                      {"element_bytes": int(np.prod(images.shape[1:])) * 4})
