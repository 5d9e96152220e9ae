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


def test_keras_timings_are_labelled_with_the_device_the_child_ran_on(monkeypatch):
    """A GPU box's TF child reports its GPU (mixed_float16 on the GPU), and the timing says so, not 'CPU'."""
    from labkit.tf import precision

    def child(target, kwargs):
        return {"policy": kwargs["policy"], "times_s": [0.01], "device": "NVIDIA H100 80GB HBM3 (TensorFlow /GPU:0)"}
    monkeypatch.setattr(precision, "run_in_fresh_process", child)
    out = precision.keras_mixed_precision(("float32", "mixed_float16"), batch_size=8, repeats=1)
    assert out["mixed_float16"]["timing"].device.startswith("NVIDIA H100 80GB HBM3 (TensorFlow /GPU:0)")


def test_tf_device_label_names_the_gpu_tensorflow_lists(monkeypatch):
    from labkit.tf import distribute

    class Experimental:
        @staticmethod
        def get_device_details(device):
            return {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)}

    class Config:
        experimental = Experimental

        @staticmethod
        def list_physical_devices(kind):
            return gpus if kind == "GPU" else ["cpu"]

    fake = type("FakeTF", (), {"config": Config})
    monkeypatch.setattr(distribute, "_tf", lambda: fake)
    gpus = ["/physical_device:GPU:0"]
    assert distribute.tf_device_label() == "NVIDIA H100 80GB HBM3 (TensorFlow /GPU:0)"
    gpus = []
    assert distribute.tf_device_label() == "CPU (TensorFlow)"


@pytest.mark.tensorflow
def test_keras_mixed_float16_policy_child_runs_with_loss_scaling():
    """The GPU policy (fp16 + LossScaleOptimizer) runs end to end; on a CPU it is slow but correct."""
    out = run_in_fresh_process("labkit.tf.precision:keras_policy_child",
                               {"policy": "mixed_float16", "batch_size": 8, "repeats": 1, "warmup": 1})
    assert out["compute_dtype"] == "float16" and out["variable_dtype"] == "float32"
    assert out["output_dtype"] == "float32"
    assert out["device"] == "CPU (TensorFlow)" or "(TensorFlow /GPU:0)" in out["device"]
