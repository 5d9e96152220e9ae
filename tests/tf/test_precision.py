"""Keras mixed precision: the dtype-policy child, run in a fresh TensorFlow process."""
import pytest

from labkit.core.procs import run_in_fresh_process


@pytest.mark.tensorflow
def test_keras_mixed_bfloat16_policy_child():
    out = run_in_fresh_process("labkit.tf.precision:keras_policy_child",
                               {"policy": "mixed_bfloat16", "batch_size": 8, "repeats": 1, "warmup": 1})
    assert out["compute_dtype"] == "bfloat16" and out["variable_dtype"] == "float32"
    assert out["output_dtype"] == "float32" and len(out["times_s"]) == 1
    assert out["tf2_api_has_graph_rewrite"] is False        # the TF1 AMP graph rewrite is gone from the TF2 API
