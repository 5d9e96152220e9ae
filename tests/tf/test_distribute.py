"""TF device helper: anything that touches TensorFlow's devices runs in a fresh child process, so this
pytest process never initialises TensorFlow. (The per-replica batch rule: tests/training/test_batch_rules.py.)"""
import pytest

from labkit.core.procs import run_in_fresh_process
from labkit.tf import distribute
from labkit.tf.distribute import DevicesAlreadyInitializedError, make_strategy, plan_strategy


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


@pytest.mark.parametrize("world_size,gpus,use_gpus,expected", [
    (2, 0, None, (False, 2)), (2, 1, None, (False, 2)), (2, 2, None, (True, 2)), (None, 4, None, (True, 4)),
    (None, 0, None, (False, 2)), (2, 4, False, (False, 2)), (1, 1, None, (True, 1)),
])
def test_plan_strategy_uses_gpus_only_with_one_per_replica(world_size, gpus, use_gpus, expected):
    on_gpu, replicas, why = plan_strategy(world_size, gpus, use_gpus)
    assert (on_gpu, replicas) == expected
    assert why.startswith(f"{replicas} GPU(s)" if on_gpu else f"{replicas} logical CPU devices")
    if gpus and not on_gpu and use_gpus is None:
        assert f"{gpus} GPU(s) for {replicas} replicas" in why     # a one-GPU box says why its replicas are CPUs


def test_plan_strategy_refuses_impossible_gpu_requests():
    with pytest.raises(ValueError, match="sees no GPU"):
        plan_strategy(2, 0, use_gpus=True)
    with pytest.raises(ValueError, match=r"only 1 GPU\(s\) are visible"):
        plan_strategy(2, 1, use_gpus=True)


class _FakeTF:
    """Just enough of TensorFlow's API for make_strategy's GPU branch: 2 GPUs listed, strategies recorded."""

    def __init__(self, gpus: int):
        fake = self
        self.gpus, self.made = gpus, []

        class Distribute:
            class MirroredStrategy:
                def __init__(self, devices, cross_device_ops=None):
                    fake.made.append((list(devices), type(cross_device_ops).__name__))

            NcclAllReduce = type("NcclAllReduce", (), {})
            ReductionToOneDevice = type("ReductionToOneDevice", (), {})
            HierarchicalCopyAllReduce = type("HierarchicalCopyAllReduce", (), {})

        class Config:
            @staticmethod
            def list_physical_devices(kind):
                return [f"/physical_device:GPU:{i}" for i in range(fake.gpus)] if kind == "GPU" else ["cpu"]

        self.distribute, self.config = Distribute, Config


def test_make_strategy_gpu_branch_with_mocked_gpus(monkeypatch):
    fake = _FakeTF(gpus=2)
    monkeypatch.setattr(distribute, "_tf", lambda: fake)
    make_strategy(2)
    make_strategy(cross_device_ops_name="hierarchical_copy")
    assert fake.made == [(["/gpu:0", "/gpu:1"], "NcclAllReduce"), (["/gpu:0", "/gpu:1"], "HierarchicalCopyAllReduce")]
    with pytest.raises(ValueError, match=r"only 2 GPU\(s\)"):
        make_strategy(3, use_gpus=True)


def test_make_strategy_on_one_gpu_falls_back_to_logical_cpus(monkeypatch):
    fake = _FakeTF(gpus=1)
    monkeypatch.setattr(distribute, "_tf", lambda: fake)
    monkeypatch.setattr(distribute, "configure_logical_cpus", lambda n: [f"/cpu:{i}" for i in range(n)])
    make_strategy(2)
    assert fake.made == [(["/cpu:0", "/cpu:1"], "ReductionToOneDevice")]
