"""TensorFlow pitfalls: the broken and fixed variants give the evidence notebook 09 asserts on."""
import numpy as np
import pytest

from labkit.core.procs import run_in_fresh_process
from labkit.tf.pitfalls import BN_VARIANTS, uneven_example_count, uneven_last_batch_bn


def test_uneven_example_count():
    assert uneven_example_count(100, 32) == 97
    assert uneven_example_count(100, 32, remainder=3) == 99
    with pytest.raises(ValueError):
        uneven_example_count(10, 32)


def test_bn_rejects_unknown_variant():
    x = np.zeros((65, 4), "float32")
    with pytest.raises(ValueError, match="variants"):
        uneven_last_batch_bn(x, np.zeros(65), x, np.zeros(65), variants=("nope",))
    assert "drop_remainder" in BN_VARIANTS


@pytest.mark.tensorflow
def test_bn_nan_reproduced_and_fixed():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(81, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    ev = uneven_last_batch_bn(x, y, x[:16], y[:16], global_batch_size=8, world_size=2,
                              variants=("broken", "synchronized_bn"))
    assert ev.num_examples == 81 and ev.last_step_replica_batch_sizes == (1, 0)
    assert len(ev.replica_devices) == 2 and all("CPU" in d.upper() for d in ev.replica_devices)   # no GPU here
    assert np.isfinite(ev.broken.train_loss)
    assert np.isnan(ev.broken.moving_mean).any() and not ev.broken.predictions_finite
    fixed = ev.run("synchronized_bn")
    assert fixed.stats_finite and fixed.predictions_finite and fixed.reload_max_abs_diff < 1e-4


@pytest.mark.tensorflow
def test_counting_logical_devices_blocks_configuration():
    out = run_in_fresh_process("labkit.tf.pitfalls:count_then_configure", {"method": "logical"})
    assert out["strategy_world_size"] is None and "restart the kernel" in out["error"]
