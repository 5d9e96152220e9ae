"""TensorFlow distribution on whatever is present: a MirroredStrategy over R GPUs, or over R logical CPUs.

TensorFlow fixes its device list the first time it runs anything in a process, so logical CPU devices
(``tf.config.set_logical_device_configuration``) must be asked for *before* that; ``make_strategy`` says
so clearly when it is too late. Because of that one-shot rule (and to keep PyTorch and TensorFlow out of
one 2 GB Binder kernel), the notebooks run each TF experiment in a fresh process with
``run_in_fresh_process`` (labkit.core.procs), which loads only the TF-side labkit modules, never torch.

This module imports neither torch nor anything that does; TensorFlow is imported lazily.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from labkit.core.validation import positive_int
from labkit.training.batch_rules import per_replica_batch

if TYPE_CHECKING:
    import tensorflow as tf

CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduction_to_one_device")


class DevicesAlreadyInitializedError(RuntimeError):
    """TensorFlow initialised its devices before the logical CPUs were configured."""


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def configure_logical_cpus(count: int) -> list[str]:
    """Split the CPU into ``count`` logical devices (before TF initialises); returns the logical CPU names."""
    count = positive_int(count, "count")
    tf = _tf()
    cpu = tf.config.list_physical_devices("CPU")[0]   # listing *physical* devices does not initialise TF
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as err:
        have = [d.name for d in tf.config.list_logical_devices("CPU")]
        if len(have) >= count:          # already split (e.g. the cell ran twice): reuse the first `count`
            return have[:count]
        raise DevicesAlreadyInitializedError(
            f"TensorFlow has already initialised its devices in this process with {len(have)} logical CPU(s), "
            f"so {count} cannot be configured now ({err}). Fix: restart the kernel/process and call "
            f"make_strategy({count}) (or configure_logical_cpus) before any other TensorFlow call — even "
            "tf.constant or tf.config.list_logical_devices initialises the devices") from None
    return [d.name for d in tf.config.list_logical_devices("CPU")][:count]


def _nccl_on_cpu() -> None:
    raise ValueError("cross_device_ops='nccl' needs GPUs (NCCL has no CPU kernels); on CPUs use "
                     "'reduction_to_one_device' or 'hierarchical_copy'")


def cross_device_ops(name: str, device_type: str) -> tf.distribute.CrossDeviceOps:
    """The tf.distribute cross-device reduction called ``name`` (see CROSS_DEVICE_OPS); NCCL needs GPUs."""
    tf = _tf()
    if name not in CROSS_DEVICE_OPS:
        raise ValueError(f"cross_device_ops must be one of {CROSS_DEVICE_OPS}, got {name!r}")
    if name == "auto":
        name = "nccl" if device_type == "GPU" else "reduction_to_one_device"
    if name == "nccl":
        if device_type != "GPU":
            _nccl_on_cpu()
        return tf.distribute.NcclAllReduce()
    if name == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    return tf.distribute.ReductionToOneDevice()


def plan_strategy(world_size: int | None, gpu_count: int, use_gpus: bool | None = None) -> tuple[bool, int, str]:
    """(on the GPUs?, replicas, why) for a MirroredStrategy, from the GPUs TensorFlow lists: the GPUs when there
    is one per replica, else logical CPU devices (a one-GPU box runs 2 replicas on CPUs and says so)."""
    if world_size is not None:
        positive_int(world_size, "world_size")
    if use_gpus and not gpu_count:
        raise ValueError("use_gpus=True but TensorFlow sees no GPU (is tensorflow[and-cuda] installed?); "
                         "use use_gpus=None to fall back to logical CPUs")
    if use_gpus is None:
        use_gpus = gpu_count > 0 and (world_size is None or world_size <= gpu_count)
    if world_size is None:
        world_size = gpu_count if use_gpus else 2
    if not use_gpus:
        why = ("no GPU visible to TensorFlow" if not gpu_count else
               f"{gpu_count} GPU(s) for {world_size} replicas (one GPU per replica needed)")
        return False, world_size, f"{world_size} logical CPU devices: {why}"
    if world_size > gpu_count:
        raise ValueError(f"world_size={world_size} but only {gpu_count} GPU(s) are visible; ask for at most "
                         f"{gpu_count}, or pass use_gpus=False to use {world_size} logical CPU devices")
    return True, world_size, f"{world_size} GPU(s), one replica each"


def make_strategy(world_size: int | None = None, *, cross_device_ops_name: str = "auto",
                  use_gpus: bool | None = None) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy with ``world_size`` replicas: on the GPUs if there is one per replica, else on logical CPUs.

    ``world_size=None`` means one per GPU (or 2 logical CPUs on a CPU-only machine). Call it before any other
    TensorFlow work in the process; ``cross_device_ops_name`` picks the all-reduce (NCCL on GPUs by default).
    :func:`plan_strategy` says where the replicas go and why.
    """
    if world_size is not None:
        positive_int(world_size, "world_size")
    if cross_device_ops_name not in CROSS_DEVICE_OPS:
        raise ValueError(f"cross_device_ops_name must be one of {CROSS_DEVICE_OPS}, got {cross_device_ops_name!r}")
    if cross_device_ops_name == "nccl" and use_gpus is False:   # refuse before TensorFlow is even imported
        _nccl_on_cpu()
    tf = _tf()
    on_gpu, world_size, _ = plan_strategy(world_size, len(tf.config.list_physical_devices("GPU")), use_gpus)
    names = [f"/gpu:{i}" for i in range(world_size)] if on_gpu else configure_logical_cpus(world_size)
    ops = cross_device_ops(cross_device_ops_name, "GPU" if on_gpu else "CPU")
    return tf.distribute.MirroredStrategy(names, cross_device_ops=ops)


def tf_device_label() -> str:
    """Where a TensorFlow process without a strategy runs its ops: the first GPU it lists, else the CPU."""
    tf = _tf()
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU (TensorFlow)"
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    return f"{name} (TensorFlow /GPU:0)"


# ---------------------------------------------------------------------------------------------- lessons (child side)
def strategy_tour(world_size: int = 2, global_batch_size: int = 8, num_examples: int = 20) -> dict:
    """MirroredStrategy basics, for a fresh process: devices, reductions, a distributed tf.data pipeline."""
    tf = _tf()
    strategy = make_strategy(world_size)
    out: dict[str, Any] = {"world_size": strategy.num_replicas_in_sync,
                           "devices": list(strategy.extended.worker_devices)}
    out["reductions"] = reduction_check(world_size)
    per_replica = per_replica_batch(global_batch_size, strategy.num_replicas_in_sync)
    ds = tf.data.Dataset.range(num_examples).batch(global_batch_size)
    steps = []
    for batch in strategy.experimental_distribute_dataset(ds):
        steps.append([t.numpy().tolist() for t in strategy.experimental_local_results(batch)])
    out.update(per_replica_batch_size=per_replica, distributed_batches=steps,
               uneven_batches=_uneven_split(strategy, num_examples=5, global_batch_size=4),
               sharding=shard_by_worker(num_examples=12, world_size=2))
    return out


def _uneven_split(strategy, num_examples: int, global_batch_size: int) -> list:
    """Per-replica pieces of a pipeline whose last global batch is smaller than the replica count."""
    tf = _tf()
    ds = tf.data.Dataset.range(num_examples).batch(global_batch_size)
    return [[t.numpy().tolist() for t in strategy.experimental_local_results(b)]
            for b in strategy.experimental_distribute_dataset(ds)]


def reduction_check(world_size: int = 2) -> dict:
    """All-reduce ``replica_id + 1`` with each CPU-capable cross-device op; every replica should hold the sum."""
    tf = _tf()
    names = configure_logical_cpus(world_size)
    results = {}
    for name in ("reduction_to_one_device", "hierarchical_copy"):
        strategy = tf.distribute.MirroredStrategy(names, cross_device_ops=cross_device_ops(name, "CPU"))

        @tf.function
        def step():
            ctx = tf.distribute.get_replica_context()
            value = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.fill([3], value))

        per_replica = strategy.experimental_local_results(strategy.run(step))
        results[name] = [t.numpy().tolist() for t in per_replica]
    return results


def shard_by_worker(num_examples: int = 12, world_size: int = 2) -> dict:
    """What ``dataset.shard(world_size, index)`` gives each of ``world_size`` workers, and TF's auto-shard policies."""
    positive_int(world_size, "world_size")
    tf = _tf()
    shards = [list(tf.data.Dataset.range(num_examples).shard(world_size, i).as_numpy_iterator())
              for i in range(world_size)]
    policies = [p.name for p in tf.data.experimental.AutoShardPolicy]
    return {"shards": [[int(v) for v in s] for s in shards], "auto_shard_policies": policies}
