"""Multi-GPU pitfalls on the TensorFlow side, each run broken and fixed in a fresh TF process.

1. An uneven last batch leaves one MirroredStrategy replica with zero examples; Keras BatchNormalization
   then writes NaN into that replica's moving statistics (and the NaN reaches ``gamma`` through the
   all-reduced gradient) while ``fit()`` still reports a finite loss. Fixes: drop the remainder, pad by
   repeating the data, or synchronised BatchNorm.
4. (Keras side) save the model you built under ``strategy.scope()`` and reload it with no strategy.
5. Counting devices has side effects: ``tf.config.list_logical_devices`` initialises TensorFlow (devices
   can no longer be configured); ``tf.config.list_physical_devices`` does not.

The parent side (the notebook) needs only numpy; TensorFlow runs in children via ``run_in_fresh_process``.
"""
from __future__ import annotations

import concurrent.futures
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labkit.core.clock import now_s
from labkit.core.procs import run_in_fresh_process
from labkit.core.validation import checked_int, positive_int
from labkit.tf.distribute import DevicesAlreadyInitializedError, make_strategy

BN_VARIANTS = ("broken", "drop_remainder", "repeat", "synchronized_bn")


@dataclass(frozen=True)
class BatchNormRun:
    """One Keras run under MirroredStrategy: what fit() reported and what the model really holds."""

    variant: str
    train_loss: float
    train_accuracy: float
    moving_mean: np.ndarray          # (replicas, channels): each replica's copy
    moving_variance: np.ndarray      # (replicas, channels)
    nan_variables: tuple[str, ...]   # variables with a NaN on any replica
    val_loss: float
    val_accuracy: float
    predictions_finite: bool
    reload_max_abs_diff: float | None   # saved .keras file reloaded without a strategy vs the live model

    @property
    def stats_finite(self) -> bool:
        """True when every replica's moving mean and variance are finite."""
        return bool(np.isfinite(self.moving_mean).all() and np.isfinite(self.moving_variance).all())


@dataclass(frozen=True)
class BatchNormNanEvidence:
    """Pitfall 1: the broken run and each fixed run on the same data."""

    num_examples: int
    global_batch_size: int
    world_size: int
    last_step_replica_batch_sizes: tuple[int, ...]   # what each replica got on the final step
    runs: tuple[BatchNormRun, ...]
    replica_devices: tuple[str, ...] = ()            # where the replicas ran: GPUs, or logical CPUs (plan_strategy)

    def run(self, variant: str) -> BatchNormRun:
        """The run called ``variant`` (see BN_VARIANTS)."""
        for r in self.runs:
            if r.variant == variant:
                return r
        raise KeyError(f"no run {variant!r}; have {[r.variant for r in self.runs]}")

    @property
    def broken(self) -> BatchNormRun:
        """The run without a fix."""
        return self.run("broken")


def uneven_example_count(available: int, global_batch_size: int, remainder: int = 1) -> int:
    """The largest count <= ``available`` that leaves ``remainder`` examples in the last global batch."""
    positive_int(global_batch_size, "global_batch_size")
    checked_int(remainder, "remainder", maximum=global_batch_size - 1, hint="the last batch must be short")
    n = (available - remainder) // global_batch_size * global_batch_size + remainder
    if n <= remainder:
        raise ValueError(f"need more than {global_batch_size + remainder} examples, got {available}")
    return n


def uneven_last_batch_bn(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, *,
                         global_batch_size: int = 32, world_size: int = 2,
                         variants: tuple[str, ...] = ("broken", "drop_remainder"), epochs: int = 1,
                         seed: int = 0, timeout_s: float = 300.0) -> BatchNormNanEvidence:
    """Pitfall 1: train a BatchNorm MLP with MirroredStrategy on data whose last batch < ``world_size``."""
    bad = [v for v in variants if v not in BN_VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants must be chosen from {BN_VARIANTS}, got {variants!r}")
    n = uneven_example_count(len(x_train), global_batch_size, remainder=1)
    checked_int(world_size, "world_size", minimum=2, hint="with one replica no replica is ever left without examples")
    positive_int(epochs, "epochs")
    with tempfile.TemporaryDirectory(prefix="labkit-bn-") as tmp:
        data = Path(tmp) / "data.npz"
        np.savez(data, x=x_train[:n].reshape(n, -1).astype("float32"), y=y_train[:n].astype("int32"),
                 xv=x_val.reshape(len(x_val), -1).astype("float32"), yv=y_val.astype("int32"))
        out = run_in_fresh_process("labkit.tf.pitfalls:bn_child", dict(
            data_path=str(data), global_batch_size=global_batch_size, world_size=world_size,
            variants=list(variants), epochs=epochs, seed=seed), timeout_s=timeout_s)
    runs = tuple(BatchNormRun(r["variant"], r["train_loss"], r["train_accuracy"], np.array(r["moving_mean"]),
                              np.array(r["moving_variance"]), tuple(r["nan_variables"]), r["val_loss"],
                              r["val_accuracy"], r["predictions_finite"], r["reload_max_abs_diff"])
                 for r in out["runs"])
    return BatchNormNanEvidence(n, global_batch_size, world_size, tuple(out["last_step_sizes"]), runs,
                                tuple(out["devices"]))


# ---------------------------------------------------------------------------------------------- child side
def _replica_values(variable) -> np.ndarray:
    """Every replica's copy of a (mirrored) variable, stacked: (replicas, ...)."""
    inner = getattr(variable, "value", variable)
    copies = getattr(inner, "values", None) or (inner,)
    return np.stack([np.asarray(c.numpy()) for c in copies])


def _bn_model(tf, features: int, synchronized: bool):
    L = tf.keras.layers
    model = tf.keras.Sequential([tf.keras.Input((features,)), L.Dense(64),
                                 L.BatchNormalization(synchronized=synchronized), L.ReLU(), L.Dense(10)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9), metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _bn_dataset(tf, x, y, global_batch_size: int, variant: str, seed: int):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed, reshuffle_each_iteration=False)
    if variant == "drop_remainder":
        return ds.batch(global_batch_size, drop_remainder=True), {}
    if variant == "repeat":   # pad the last batch with examples from the next pass over the data
        return ds.repeat().batch(global_batch_size), {"steps_per_epoch": -(-len(x) // global_batch_size)}
    return ds.batch(global_batch_size), {}


def _bn_run(tf, strategy, data, global_batch_size: int, variant: str, epochs: int, seed: int, tmp: str) -> dict:
    tf.keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = _bn_model(tf, data["x"].shape[1], synchronized=variant == "synchronized_bn")
    ds, extra = _bn_dataset(tf, data["x"], data["y"], global_batch_size, variant, seed)
    hist = model.fit(ds, epochs=epochs, verbose=0, **extra).history
    bn = model.layers[1]
    nan_vars = [v.path for v in model.variables if np.isnan(_replica_values(v)).any()]
    val_loss, val_acc = model.evaluate(data["xv"], data["yv"], verbose=0)
    pred = model.predict(data["xv"], verbose=0)
    reload_diff = None
    if variant != "broken":                       # pitfall 4, Keras side: save the model itself, reload plainly
        path = os.path.join(tmp, f"{variant}.keras")
        model.save(path)
        plain = tf.keras.models.load_model(path)  # no strategy scope here
        reload_diff = float(np.abs(plain.predict(data["xv"], verbose=0) - pred).max())
    return {"variant": variant, "train_loss": float(hist["loss"][-1]), "train_accuracy": float(hist["accuracy"][-1]),
            "moving_mean": _replica_values(bn.moving_mean).tolist(),
            "moving_variance": _replica_values(bn.moving_variance).tolist(), "nan_variables": nan_vars,
            "val_loss": float(val_loss), "val_accuracy": float(val_acc),
            "predictions_finite": bool(np.isfinite(pred).all()), "reload_max_abs_diff": reload_diff}


def bn_child(data_path: str, global_batch_size: int, world_size: int, variants: list, epochs: int, seed: int) -> dict:
    """Child process: the pitfall-1 runs (NaN checks are JSON-safe: NaN is written as NaN)."""
    strategy = make_strategy(world_size, use_gpus=None)
    import tensorflow as tf

    data = dict(np.load(data_path))
    last = tf.data.Dataset.from_tensor_slices(data["y"]).batch(global_batch_size)
    *_, final = strategy.experimental_distribute_dataset(last)
    sizes = [int(t.shape[0]) for t in strategy.experimental_local_results(final)]
    with tempfile.TemporaryDirectory(prefix="labkit-keras-") as tmp:
        runs = [_bn_run(tf, strategy, data, global_batch_size, v, epochs, seed, tmp) for v in variants]
    return {"last_step_sizes": sizes, "runs": runs, "devices": list(strategy.extended.worker_devices)}


# ---------------------------------------------------------------------------------------------- pitfall 5
@dataclass(frozen=True)
class DeviceCountProbe:
    """One fresh process: count devices a given way, then try to set up ``world_size`` logical CPU replicas."""

    method: str
    devices_counted: int
    count_call_ms: float
    strategy_world_size: int | None  # None when configuring devices afterwards failed
    error: str | None


def count_then_configure(method: str = "physical", world_size: int = 2) -> dict:
    """Child process: count devices by ``method`` ('physical' or 'logical'), then call make_strategy."""
    import tensorflow as tf

    start = now_s()
    if method == "physical":
        count = len(tf.config.list_physical_devices())
    elif method == "logical":
        count = len(tf.config.list_logical_devices())
    else:
        raise ValueError(f"method must be 'physical' or 'logical', got {method!r}")
    call_ms = (now_s() - start) * 1e3
    try:
        # logical CPUs on every machine: the lesson is configuring devices, which GPUs (one per replica) would skip
        got, error = make_strategy(world_size, use_gpus=False).num_replicas_in_sync, None
    except DevicesAlreadyInitializedError as err:
        got, error = None, str(err)
    return {"method": method, "devices_counted": count, "count_call_ms": call_ms, "strategy_world_size": got,
            "error": error}


def device_counting_side_effects(world_size: int = 2, timeout_s: float = 300.0) -> dict[str, DeviceCountProbe]:
    """Pitfall 5: count devices two ways, each in a fresh TF process (run side by side), then configure."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {m: pool.submit(run_in_fresh_process, "labkit.tf.pitfalls:count_then_configure",
                                  {"method": m, "world_size": world_size}, timeout_s=timeout_s)
                   for m in ("physical", "logical")}
        out = {m: f.result() for m, f in futures.items()}
    return {m: DeviceCountProbe(r["method"], r["devices_counted"], r["count_call_ms"], r["strategy_world_size"],
                                r["error"]) for m, r in out.items()}
