import numpy as np
import pytest

from labkit.tf.keras import keras_batch_throughput


def test_updates_per_epoch_follow_the_batch_size():
    rng = np.random.default_rng(0)
    x, y = rng.random((48, 8, 8, 3), dtype=np.float32), rng.integers(0, 3, 48)
    out = keras_batch_throughput(x, y, batch_sizes=(4, 16), epochs=2)
    assert out[4]["updates_per_epoch"] == 12 and out[16]["updates_per_epoch"] == 3
    assert all(r["samples_per_s"] > 0 for r in out.values())


def test_bad_input_is_clear():
    x, y = np.zeros((10, 8, 8, 3), np.float32), np.zeros(10, np.int64)
    with pytest.raises(ValueError, match="between 1 and 10"):
        keras_batch_throughput(x, y, batch_sizes=(0,))
    with pytest.raises(ValueError, match="epochs must be >= 2"):
        keras_batch_throughput(x, y, epochs=1)
    with pytest.raises(ValueError, match=r"\(N, H, W, C\)"):
        keras_batch_throughput(x[0], y)
