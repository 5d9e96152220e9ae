"""Keras: the twin of ``labkit.core.models.SmallCNN``, and batch size in ``model.fit(batch_size=...)`` timed per batch.

The twin lives in a module that never imports PyTorch, so TensorFlow-only child processes (profiling, mixed
precision, tf.distribute) can build it cheaply. The batch-size timing runs TensorFlow in a fresh child process
(``labkit.core.procs``): TensorFlow and PyTorch in one kernel cost ~0.5 GB more than Binder's 2 GB allows next
to the batch-size lab's own PyTorch work. Torch-free on purpose.
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from labkit.core.clock import now_s
from labkit.core.procs import run_in_fresh_process
from labkit.core.validation import checked_int, positive_int
from labkit.tf.distribute import tf_device_label

if TYPE_CHECKING:
    import tensorflow as tf


def keras_small_cnn(num_classes: int = 10, image_shape: tuple[int, int, int] = (32, 32, 3), width: int = 32,
                    float32_logits: bool = False) -> tf.keras.Sequential:
    """Two conv blocks and a linear head (channels-last input, as Keras expects).

    ``float32_logits=True`` ends in a float32 activation, as mixed-precision policies want for a stable loss.
    """
    import tensorflow as tf

    L = tf.keras.layers
    layers = [
        tf.keras.Input(shape=image_shape),
        L.Conv2D(width, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPooling2D(2),
        L.Conv2D(2 * width, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
        L.GlobalAveragePooling2D(), L.Dense(num_classes),
    ]
    if float32_logits:
        layers.append(L.Activation("linear", dtype="float32"))
    return tf.keras.Sequential(layers)


def keras_fit_child(data_path: str, batch_sizes: list[int], epochs: int = 2, lr: float = 0.05,
                    seed: int = 0) -> dict:
    """Child side: fit the Keras small CNN once per batch size; per batch size, updates per epoch and the
    median samples/s over the batches after the first epoch (which includes graph tracing)."""
    import tensorflow as tf

    arrays = np.load(data_path)
    x, y = arrays["x"], arrays["y"]
    out = {}
    for bs in batch_sizes:
        tf.keras.utils.set_random_seed(seed)
        model = keras_small_cnn(int(y.max()) + 1, x.shape[1:])
        model.compile(optimizer=tf.keras.optimizers.SGD(lr, momentum=0.9),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        timer = _batch_timer(tf, bs)
        n = len(x) - len(x) % bs
        model.fit(x[:n], y[:n], batch_size=bs, epochs=epochs, verbose=0, callbacks=[timer])
        out[str(bs)] = {"updates_per_epoch": len(timer.rates) // max(epochs - 1, 1),
                        "samples_per_s": statistics.median(timer.rates), "device": tf_device_label()}
    return out


def _batch_timer(tf, batch_size: int):
    """A Keras callback that records samples/s of every batch after the first epoch (which traces the graph)."""
    class BatchTimer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.rates, self.epoch, self.t0 = [], 0, 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.t0 = now_s()

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch >= 1:
                self.rates.append(batch_size / (now_s() - self.t0))

    return BatchTimer()


def keras_batch_throughput(x: np.ndarray, y: np.ndarray, batch_sizes: tuple[int, ...] = (8, 128), *,
                           epochs: int = 2, lr: float = 0.05, timeout_s: float = 300.0) -> dict[int, dict]:
    """Time ``model.fit(batch_size=b)`` for each b on channels-last images ``x`` (N, H, W, C) and labels ``y``."""
    if x.ndim != 4 or len(x) != len(y):
        raise ValueError(f"x must be (N, H, W, C) images with one label each, got x {x.shape}, y {y.shape}")
    checked_int(epochs, "epochs", minimum=2, hint="the first epoch traces the graph and is not timed")
    for bs in batch_sizes:
        positive_int(bs, "each value in batch_sizes", maximum=len(x), hint=f"x holds {len(x)} images")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "data.npz")
        np.savez(path, x=x.astype(np.float32), y=y.astype(np.int64))
        out = run_in_fresh_process("labkit.tf.keras:keras_fit_child", dict(
            data_path=path, batch_sizes=list(batch_sizes), epochs=epochs, lr=lr), timeout_s=timeout_s)
    out.pop("child_wall_s", None)
    return {int(bs): row for bs, row in out.items()}
