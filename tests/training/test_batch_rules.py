"""Batch-size rules: linear LR scaling (Goyal et al. 2017) and each replica's share of the global batch."""
import subprocess
import sys
import warnings

import pytest

from labkit.training.batch_rules import accuracy_gap, per_replica_batch, scaled_lr


def test_lr_scaling():
    assert scaled_lr(0.1, 256, 32) == pytest.approx(0.8)
    assert scaled_lr(0.1, 128, base_batch=32, rule="sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 256, base_batch=32, rule="none") == 0.1


@pytest.mark.parametrize("kwargs, message", [
    (dict(base_lr=0.0, batch_size=64), "base_lr must be a number > 0, got 0.0"),
    (dict(base_lr=0.1, batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(base_lr=0.1, batch_size=64, base_batch=2.0), "base_batch must be an integer >= 1, got 2.0"),
    (dict(base_lr=0.1, batch_size=64, rule="cubic"), "rule must be one of"),
])
def test_lr_scaling_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        scaled_lr(**kwargs)


def test_per_replica_batch_rule_of_thumb():
    assert per_replica_batch(256, 8) == 32
    with pytest.raises(ValueError, match="multiple of 3"):
        per_replica_batch(256, 3)
    with pytest.warns(UserWarning, match="8 samples per replica is too few .* >= 16"):
        per_replica_batch(64, 8, on_gpu=True)


# ---------------------------------------------------------------- the one rule (was also tf.distribute's)
def test_per_replica_batch_divides():
    assert per_replica_batch(64, 2) == 32
    assert per_replica_batch(48, 3, on_gpu=True) == 16


def test_per_replica_batch_uneven_names_fix():
    with pytest.raises(ValueError, match="multiple of 2, e.g. 6 or 8"):
        per_replica_batch(7, 2)
    with pytest.raises(ValueError, match="world_size=4 .* multiple of 4, e.g. 4 or 8"):
        per_replica_batch(3, 4, on_gpu=True)              # not divisible is an error on any device


def test_per_replica_batch_small_gpu_batch_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert per_replica_batch(16, 2, on_gpu=True) == 8
    assert any("at least 32" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        per_replica_batch(16, 2, on_gpu=False)     # CPU: no GPU-occupancy warning
        per_replica_batch(16, 2)                   # the default is the CPU lessons' case
        per_replica_batch(32, 2, on_gpu=True)      # 16 per GPU: at the rule of thumb, no warning
    with pytest.warns(UserWarning, match="rule of thumb: >= 64"):
        per_replica_batch(64, 2, on_gpu=True, min_per_replica=64)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_per_replica_batch_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="global_batch must be an integer >= 1"):
        per_replica_batch(bad, 2)
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        per_replica_batch(8, bad)


@pytest.mark.parametrize("module", ["labkit.training.batch_rules", "labkit.tf.precision"])
def test_torch_free_import(module):
    """TensorFlow-only children import these: they must not load torch."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-500:]


def test_accuracy_gap_checks_a_gap_beyond_the_sampling_error_and_names_its_rival():
    won = accuracy_gap("big learns less", 0.97, 0.35, 128, rival="no difference")
    assert won.state == "checked" and won.rival == "no difference" and "rules out no difference" in won.detail
    assert accuracy_gap("big learns less", 0.35, 0.97, 128, rival="no difference").state == "failed"


def test_accuracy_gap_when_the_rival_is_true_is_inconclusive_with_the_images_it_would_take():
    same = accuracy_gap("big learns less", 0.50, 0.50, 128, rival="no difference")     # the rival holds: no gap
    assert same.state == "INCONCLUSIVE" and same.kind == "statistics" and "no gap" in same.detail
    near = accuracy_gap("big learns less", 0.55, 0.50, 128, rival="no difference")     # 0.8 standard errors
    assert near.state == "INCONCLUSIVE" and "validation images would settle it" in near.detail
    with pytest.raises(ValueError, match="accuracy in"):
        accuracy_gap("x", 1.5, 0.5, 128, rival="no difference")
