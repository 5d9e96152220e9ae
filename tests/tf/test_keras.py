"""Tests for labkit.tf.keras: the Keras twin of the small CNN, and model.fit(batch_size=) timed per batch."""
import subprocess
import sys

import numpy as np
import pytest

from labkit.tf.keras import keras_batch_throughput, keras_small_cnn


@pytest.mark.tensorflow
def test_updates_per_epoch_follow_the_batch_size():
    rng = np.random.default_rng(0)
    x, y = rng.random((48, 8, 8, 3), dtype=np.float32), rng.integers(0, 3, 48)
    out = keras_batch_throughput(x, y, batch_sizes=(4, 16), epochs=2)
    assert out[4]["updates_per_epoch"] == 12 and out[16]["updates_per_epoch"] == 3
    assert all(r["samples_per_s"] > 0 for r in out.values())
    assert all(r["device"] in ("CPU (TensorFlow)",) or "(TensorFlow /GPU:0)" in r["device"] for r in out.values())


def test_bad_input_is_clear():
    x, y = np.zeros((10, 8, 8, 3), np.float32), np.zeros(10, np.int64)
    with pytest.raises(ValueError, match="between 1 and 10"):
        keras_batch_throughput(x, y, batch_sizes=(0,))
    with pytest.raises(ValueError, match="epochs must be an integer >= 2"):
        keras_batch_throughput(x, y, epochs=1)
    with pytest.raises(ValueError, match=r"\(N, H, W, C\)"):
        keras_batch_throughput(x[0], y)


@pytest.mark.tensorflow
def test_keras_twin_is_torch_free_and_ends_in_float32_logits():
    code = "import sys, labkit.tf.keras, labkit.core.rundirs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == "False"
    assert keras_small_cnn(float32_logits=True).layers[-1].dtype_policy.name == "float32"


def test_core_models_leaves_tensorflow_side_alone():
    """core sits below tf/: the PyTorch models module no longer re-exports the Keras twin."""
    code = "import sys, labkit.core.models; print(sorted(m for m in sys.modules if m.startswith('labkit.tf')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
