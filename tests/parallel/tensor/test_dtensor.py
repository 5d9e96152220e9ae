"""torch's plan for the kit's layer: every linear split as Megatron splits it, one input gather per block."""
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

from labkit.parallel.tensor import megatron as tp
from labkit.parallel.tensor import dtensor as tp_dtensor


def test_the_plan_splits_each_linear_like_the_hand_written_layer():
    plan = tp_dtensor.tp_plan()
    for path, split in tp.SPLITS.items():
        assert isinstance(plan[path], ColwiseParallel if split == tp.COLUMN else RowwiseParallel), path
    assert isinstance(plan["attn"], PrepareModuleInput) and isinstance(plan["mlp"], PrepareModuleInput)
    assert "ln1" not in plan


def test_the_sequence_parallel_plan_shards_the_norms_and_returns_sequence_shards():
    plan = tp_dtensor.tp_plan(sequence_parallel=True)
    assert isinstance(plan["ln1"], SequenceParallel) and isinstance(plan["ln2"], SequenceParallel)
    assert plan["attn.wo"].output_layouts == (Shard(1),)
    assert plan["attn"].input_layouts == (Shard(1),) and plan["attn"].desired_input_layouts == (Replicate(),)


def test_outside_a_process_group_the_world_is_one():
    assert tp_dtensor.world() == 1
