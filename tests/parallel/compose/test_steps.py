"""One step per composition on a rank: each rank holds its share, the pipeline's loss lives on its last stage,
replicas end with the same gradients; the pieces that need no ranks, checked in one process."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from labkit.comm.mesh import AxisGroup, Mesh
from labkit.parallel.compose.model import StackShape, stack_inputs
from labkit.parallel.compose.model import probe_mean_loss, tp_stack
from labkit.parallel.compose.steps import (COMPOSITIONS, data_parallel_step, grad_axis, local_batch, pipeline_step,
                                           upstream_loss)
from labkit.parallel.context.ring_attention import zigzag_shard

SHAPE = StackShape.fast()


def test_compositions_are_the_combinations_real_jobs_use_on_four_ranks():
    assert list(COMPOSITIONS) == ["dp x tp", "fsdp x tp", "dp x pp", "tp x cp", "pp x tp"]
    assert all(mesh.world_size == 4 for mesh, _ in COMPOSITIONS.values())
    assert grad_axis(Mesh(dp=2, tp=2)) == "dp" and grad_axis(Mesh(cp=2, tp=2)) == "dp_cp"


def test_each_rank_holds_its_share_of_the_batch():
    mesh = Mesh(dp=2, cp=2)
    groups = {"dp": AxisGroup(None, (1, 3), 1), "cp": AxisGroup(None, (2, 3), 1)}    # rank 3: dp 1, cp 1
    x, probe = local_batch(SHAPE, mesh, groups)
    whole = stack_inputs(SHAPE)[0]
    assert x.shape == (2, 16, 64)
    torch.testing.assert_close(x, zigzag_shard(whole[2:], 2, 1), rtol=0, atol=0)


def test_the_upstream_loss_carries_the_sent_gradient_back():
    out, grad = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    upstream_loss(out, grad).backward()
    torch.testing.assert_close(out.grad, grad, rtol=0, atol=0)


def test_the_hand_written_pipeline_has_two_stages():
    with pytest.raises(ValueError, match="two stages"):
        pipeline_step(SHAPE, Mesh(dp=4))


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_each_rank_holds_its_part_and_only_the_last_stage_has_a_loss(composed, name):
    ranks, reference = composed
    mesh = COMPOSITIONS[name][0]
    for rank, result in enumerate(ranks):
        stage = mesh.coords(rank)["pp"]
        layers = {n.split(".")[1] for n in result[name]["grads"]}
        assert layers == ({"0", "1"} if mesh.pp == 1 else {str(stage)})
        assert (result[name]["loss"] is None) == (mesh.pp == 2 and stage == 0)
        wq = result[name]["grads"].get(f"layers.{stage}.attn.wq.weight")
        assert wq.shape[0] == SHAPE.d_model // mesh.tp                            # tp: this rank's heads only


def test_the_training_step_for_timed_runs_updates_this_ranks_part(world_of_one):
    single = {"tp": AxisGroup(None, (0,), 0), "dp": AxisGroup(None, (0,), 0)}     # one rank: nothing to reduce
    model = tp_stack(SHAPE, [0], single["tp"])
    before = model.layers["0"].mlp.fc1.weight.detach().clone()
    step = data_parallel_step(model, Mesh(), single, torch.optim.SGD(model.parameters(), lr=0.1), probe_mean_loss)
    step(*stack_inputs(SHAPE))
    assert not torch.equal(model.layers["0"].mlp.fc1.weight, before)


def test_the_one_tp_x_dp_step_trains_this_ranks_share_and_sees_the_model_before_the_reduction(world_of_one):
    """The multi-node placements and the planner's runner both train through tensor_data_step: the feed is this
    rank's dp share (here index 1 of 2: the second half), the layers are checkpointed when asked, and the hook
    before the reduction runs once per backward (the runner reads the state held there)."""
    from labkit.parallel.compose.model import build_layers
    from labkit.parallel.compose.steps import tensor_data_step
    from labkit.sharding.checkpointing import Checkpointed

    solo = AxisGroup(None, (0,), 0)
    dp = AxisGroup(None, (0,), 0)                  # a one-rank group: nothing to reduce, the share is everything
    x, probe = stack_inputs(SHAPE)
    seen = []
    step = tensor_data_step(build_layers(SHAPE), solo, dp, (x, probe),
                            lambda params: torch.optim.SGD(params, lr=0.1), probe_mean_loss, checkpointing=True,
                            before_sync=lambda m: seen.append(sum(p.grad is not None for p in m.parameters())))
    assert all(isinstance(layer, Checkpointed) for layer in step.model) and len(step.model) == SHAPE.layers
    assert torch.equal(step.feed[0], x)
    before = [p.detach().clone() for p in step.model.parameters()]
    step(*step.feed)
    assert seen == [len(before)]                                   # every parameter has its gradient by then
    assert any(not torch.equal(p, b) for p, b in zip(step.model.parameters(), before))
    half = tensor_data_step(build_layers(SHAPE), solo, AxisGroup(None, (0, 1), 1), (x, probe),
                            lambda params: torch.optim.SGD(params, lr=0.1), probe_mean_loss)
    assert torch.equal(half.feed[0], x.chunk(2)[1])                # rank 1 of 2 trains on the second half
