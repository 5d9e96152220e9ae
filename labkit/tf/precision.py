"""Keras mixed precision, measured: dtype policies (``mixed_bfloat16``, ``mixed_float16`` with a
LossScaleOptimizer), each run in a fresh TensorFlow process (Micikevicius et al. 2018, "Mixed Precision
Training", arXiv:1710.03740; TensorFlow guide *Mixed precision*).

Torch-free: the child imports only TensorFlow, NumPy and torch-free labkit modules; TensorFlow is imported
lazily. The PyTorch side (torch.autocast, loss scaling) is :mod:`labkit.training.precision`.
"""
from __future__ import annotations

import numpy as np

from labkit.core.clock import TimingResult, host_times_s
from labkit.core.procs import run_in_fresh_process
from labkit.core.validation import positive_int
from labkit.tf.distribute import tf_device_label
from labkit.tf.keras import keras_small_cnn


def keras_policy_child(policy: str = "mixed_bfloat16", batch_size: int = 64, repeats: int = 5,
                       warmup: int = 2) -> dict:
    """Child process (TF only): time train_on_batch of a small Keras CNN under a dtype policy."""
    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy(policy)
    model = keras_small_cnn(10, (32, 32, 3), float32_logits=True)   # logits in fp32 for a stable loss
    opt = tf.keras.optimizers.SGD(0.01)
    if policy == "mixed_float16":
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)   # dynamic loss scaling for fp16
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=batch_size)
    # train_on_batch returns a host value, so the step has finished when the call returns
    times = host_times_s(lambda: model.train_on_batch(x, y), warmup=warmup, repeats=repeats)
    conv = model.layers[0]
    rewrite = "enable_mixed_precision_graph_rewrite"   # the TF1 AMP graph rewrite the policy replaced
    return {"policy": policy, "times_s": times, "device": tf_device_label(), "compute_dtype": conv.compute_dtype,
            "variable_dtype": conv.variable_dtype, "output_dtype": str(model.outputs[0].dtype),
            "tf2_api_has_graph_rewrite": hasattr(tf.train.experimental, rewrite),
            "compat_v1_has_graph_rewrite": hasattr(tf.compat.v1.mixed_precision, rewrite)}


def keras_mixed_precision(policies: tuple[str, ...] = ("float32", "mixed_bfloat16"), batch_size: int = 64,
                          repeats: int = 5) -> dict:
    """Per policy, a fresh TF process: step timings (a labkit TimingResult) and the dtypes Keras chose."""
    kwargs = {"batch_size": positive_int(batch_size, "batch_size"), "repeats": positive_int(repeats, "repeats")}
    out = {}
    for policy in policies:
        r = run_in_fresh_process("labkit.tf.precision:keras_policy_child", {"policy": policy, **kwargs})
        out[policy] = {**r, "timing": TimingResult(r["times_s"], f"{r['device']}, child process")}   # where it ran
    return out
