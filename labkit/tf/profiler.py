"""Profile a Keras ``fit`` with the TensorFlow profiler into ``runs/<experiment>/``.

Two ways, both current TF 2 APIs: ``tf.profiler.experimental.start/stop`` with one ``Trace`` per
step (default; needs only TensorFlow), or the TensorBoard callback's ``profile_batch=(first, last)``
(needs the ``tensorboard`` package, which tensorflow 2.21 no longer installs). Either writes
``<run_dir>/plugins/profile/<timestamp>/<host>.xplane.pb``. To view it (optional packages):
``pip install tensorboard tensorboard-plugin-profile`` then ``tensorboard --logdir runs`` -> Profile
tab, or the standalone XProf viewer (``pip install xprof``; ``xprof --logdir runs``).

This file imports only TensorFlow and NumPy (lazily), so it also runs as a script in a child
process (``python labkit/tf/profiler.py --run-dir runs/keras``): a notebook that already holds
PyTorch can profile Keras without holding both frameworks in one process.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from labkit.core.clock import now_s
from labkit.core.procs import run_in_fresh_process
from labkit.core.rundirs import check_writable_dir
from labkit.core.validation import checked_int, positive_int
from labkit.tf.keras import keras_small_cnn

if TYPE_CHECKING:
    import tensorflow as tf

METHODS = ("programmatic", "callback")


@dataclass(frozen=True)
class TFProfileResult:
    """Where the TF profile went and what was profiled."""

    run_dir: str
    xplane_files: list[str]
    profiled_batches: tuple[int, int]
    method: str
    fit_s: float

    def __str__(self) -> str:
        return (f"TF profile of batches {self.profiled_batches[0]}..{self.profiled_batches[1]} ({self.method}) "
                f"in {self.run_dir}: {len(self.xplane_files)} .xplane.pb file(s); view with "
                f"`tensorboard --logdir {Path(self.run_dir).parent}` -> Profile tab")


def _check_batches(profile_batch: tuple[int, int], steps_per_epoch: int) -> tuple[int, int]:
    """``(first, last)`` batches to profile, counted from 1, inside the first epoch (one clear ValueError)."""
    if not isinstance(profile_batch, (tuple, list)) or len(profile_batch) != 2:
        raise ValueError(f"profile_batch must be a pair of integers (first, last), got {profile_batch!r}")
    hint = (f"profile_batch=(first, last) needs 1 <= first <= last (batches count from 1), and an epoch has "
            f"only {steps_per_epoch} batches: profile earlier batches or give fit more data")
    first = positive_int(profile_batch[0], "profile_batch's first batch", maximum=steps_per_epoch, hint=hint)
    last = checked_int(profile_batch[1], "profile_batch's last batch", minimum=first, maximum=steps_per_epoch,
                       hint=hint)
    return first, last


def xplane_files(run_dir: str | Path) -> list[str]:
    """The ``.xplane.pb`` files the TF profiler wrote under ``run_dir``."""
    return sorted(str(p) for p in Path(run_dir).glob("plugins/profile/*/*.xplane.pb"))


def profile_keras_fit(model: tf.keras.Model, x: np.ndarray, y: np.ndarray, *, run_dir: str | Path,
                      batch_size: int = 32, epochs: int = 1,
                      profile_batch: tuple[int, int] = (2, 4), method: str = "programmatic") -> TFProfileResult:
    """``model.fit(x, y)`` with the TF profiler on batches ``profile_batch``; checks the .xplane.pb exists."""
    import tensorflow as tf

    _check_method(method)
    positive_int(batch_size, "batch_size")
    steps = -(-len(x) // batch_size)
    first, last = _check_batches(profile_batch, steps)
    run_dir = check_writable_dir(run_dir)
    # report only this run's files: TF names a session's folder by the second, so two runs within one second
    # share a path; a file counts as new when it did not exist or was rewritten
    earlier = {f: os.stat(f).st_mtime_ns for f in xplane_files(run_dir)}
    if not model.optimizer or not getattr(model, "compiled", True):
        raise ValueError("compile the model first, e.g. model.compile('sgd', loss=...)")
    start = now_s()
    if method == "callback":
        cb = tf.keras.callbacks.TensorBoard(log_dir=str(run_dir), profile_batch=(first, last), write_graph=False)
        model.fit(x, y, batch_size=batch_size, epochs=epochs, callbacks=[cb], verbose=0)
    else:
        _trace_batches(model, x, y, run_dir, batch_size, first, last)
    fit_s = now_s() - start
    files = [f for f in xplane_files(run_dir) if earlier.get(f) != os.stat(f).st_mtime_ns]
    if not files:
        raise RuntimeError(f"the TF profiler wrote no .xplane.pb under {run_dir}/plugins/profile; "
                           "check that profile_batch lies inside the first epoch")
    return TFProfileResult(str(run_dir), files, (first, last), method, fit_s)


def _trace_batches(model, x, y, run_dir: Path, batch_size: int, first: int, last: int) -> None:
    """Train batches ``1..first-1`` untraced, then ``first..last`` under the profiler, one ``Trace`` per step."""
    import tensorflow as tf

    model.fit(x[: first * batch_size], y[: first * batch_size], batch_size=batch_size, epochs=1, verbose=0)
    tf.profiler.experimental.start(str(run_dir))
    try:
        for step in range(first, last + 1):   # one Trace per step, as the profile tab's step view expects
            with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
                batch = slice((step - 1) * batch_size, step * batch_size)
                model.train_on_batch(x[batch], y[batch])
    finally:
        tf.profiler.experimental.stop()


def _check_method(method: str) -> None:
    """``method`` is one of METHODS; 'callback' needs the tensorboard package (tensorflow 2.21 does not bring it)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "callback" and importlib.util.find_spec("tensorboard") is None:
        raise ImportError("method='callback' uses the TensorBoard callback, which needs `pip install tensorboard`; "
                          "or use method='programmatic' (TensorFlow only)")


def _synthetic(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)   # SYNTHETIC: random pixels/labels, for profiling only
    return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, n)


def profile_small_cnn_child(run_dir: str, samples: int = 256, batch_size: int = 32, first: int = 2, last: int = 4,
                            method: str = "programmatic") -> dict:
    """Runs inside a fresh process: profile a small Keras CNN on synthetic data; the result as a dict."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = keras_small_cnn()
    model.compile("sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _synthetic(samples)
    return asdict(profile_keras_fit(model, x, y, run_dir=run_dir, batch_size=batch_size,
                                    profile_batch=(first, last), method=method))


def profile_keras_in_subprocess(run_dir: str | Path, *, samples: int = 256, batch_size: int = 32,
                                profile_batch: tuple[int, int] = (2, 4), method: str = "programmatic",
                                timeout_s: float = 300.0) -> TFProfileResult:
    """Profile a small Keras CNN in a fresh Python (TensorFlow only, no PyTorch) and return its result."""
    _check_method(method)   # here, so a missing tensorboard is an ImportError before any child starts
    first, last = _check_batches(profile_batch, -(-samples // batch_size))
    check_writable_dir(run_dir)
    data = run_in_fresh_process("labkit.tf.profiler:profile_small_cnn_child", dict(
        run_dir=str(Path(run_dir).resolve()), samples=samples, batch_size=batch_size, first=first, last=last,
        method=method), timeout_s=timeout_s)
    data.pop("child_wall_s", None)
    data["profiled_batches"] = tuple(data["profiled_batches"])
    return TFProfileResult(**data)
