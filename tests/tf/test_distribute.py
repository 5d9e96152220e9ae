"""TF device helper: anything that touches TensorFlow's devices runs in a fresh child process, so this
pytest process never initialises TensorFlow. (The per-replica batch rule: tests/training/test_batch_rules.py.)"""
import pytest

from labkit.core.procs import run_in_fresh_process
from labkit.tf.distribute import DevicesAlreadyInitializedError


def test_run_in_fresh_process_rejects_bad_target():
    with pytest.raises(ValueError, match="labkit.module:function"):
        run_in_fresh_process("os:getcwd")


@pytest.mark.tensorflow
def test_strategy_tour_on_two_logical_cpus():
    out = run_in_fresh_process("labkit.tf.distribute:strategy_tour", {"world_size": 2, "global_batch_size": 8,
                                                                      "num_examples": 20})
    assert out["world_size"] == 2 and len(out["devices"]) == 2
    for name, per_replica in out["reductions"].items():            # sum of (replica_id + 1) = 1 + 2
        assert per_replica == [[3.0] * 3, [3.0] * 3], name
    assert out["distributed_batches"][0] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert out["uneven_batches"][-1] == [[4], []]                   # 5 examples, batch 4: one replica is empty
    assert out["sharding"]["shards"] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]
    assert "DATA" in out["sharding"]["auto_shard_policies"]


@pytest.mark.tensorflow
def test_child_errors_come_back_with_their_type():
    with pytest.raises(ValueError, match="does not divide evenly"):
        run_in_fresh_process("labkit.tf.distribute:strategy_tour", {"global_batch_size": 7})


@pytest.mark.tensorflow
def test_make_strategy_bad_requests_are_clear():
    with pytest.raises(ValueError, match="needs GPUs"):   # NCCL on CPUs
        run_in_fresh_process("labkit.tf.distribute:make_strategy", {"world_size": 2, "cross_device_ops_name": "nccl"})


def test_too_late_error_class_is_exported():
    assert issubclass(DevicesAlreadyInitializedError, RuntimeError)


def test_nccl_on_cpus_refused_before_tensorflow_loads():
    import sys

    from labkit.tf.distribute import make_strategy

    had_tf = "tensorflow" in sys.modules
    with pytest.raises(ValueError, match="needs GPUs"):
        make_strategy(2, cross_device_ops_name="nccl", use_gpus=False)
    with pytest.raises(ValueError, match="cross_device_ops_name must be one of"):
        make_strategy(2, cross_device_ops_name="ring")
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        make_strategy(0)
    assert had_tf or "tensorflow" not in sys.modules     # the checks did not start TensorFlow here
