"""The stack, its one-process reference, and gradients put back together from tp shards (no ranks needed)."""
from __future__ import annotations

import pytest
import torch

from labkit.comm.mesh import Mesh
from labkit.parallel.compose.model import (StackShape, assemble_grads, build_layers, full_tensor, probe_mean_loss,
                                           reference_step, replicas_agree, stack_inputs, stage_layers)
from labkit.parallel.tensor.megatron import shard_state

SHAPE = StackShape.fast()


def test_the_shape_is_checked_and_the_mesh_rules_are_asked():
    with pytest.raises(ValueError, match="divisible by heads"):
        StackShape(d_model=63, heads=4)
    with pytest.raises(ValueError, match="tp: heads=4 must be divisible by tp=3"):
        SHAPE.check(Mesh(tp=3))
    with pytest.raises(ValueError, match="pp: layers=3 must be divisible by pp=2"):
        StackShape(layers=3).check(Mesh(pp=2))


def test_the_probe_loss_puts_a_different_weight_on_every_output_element():
    out = torch.randn(2, 3, 4, requires_grad=True)
    probe = torch.randn(2, 3, 4)
    probe_mean_loss(out, probe).backward()
    torch.testing.assert_close(out.grad, probe / probe.numel())


def test_the_reference_is_the_plain_stack_through_the_one_step():
    ref = reference_step(SHAPE)
    model = torch.nn.Sequential(*build_layers(SHAPE))
    x, probe = stack_inputs(SHAPE)
    loss = probe_mean_loss(model(x), probe)
    loss.backward()
    assert ref["loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(ref["grads"][f"layers.{name}"], p.grad)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_shards_put_back_together_are_the_whole_tensors(tp):
    block = build_layers(SHAPE)[0]
    full = block.state_dict()
    shards = [shard_state(full, r, tp) for r in range(tp)]
    for name, tensor in full.items():
        torch.testing.assert_close(full_tensor(f"layers.0.{name}", [s[name] for s in shards]), tensor)


def test_assemble_takes_each_stage_from_its_own_ranks_and_replicas_must_agree():
    mesh = Mesh(dp=2, pp=2)                                   # ranks: (dp0,pp0)=0, (dp0,pp1)=1, (dp1,pp0)=2, (dp1,pp1)=3
    ranks = [{"grads": {"layers.0.w": torch.zeros(1)}}, {"grads": {"layers.1.w": torch.ones(1)}},
             {"grads": {"layers.0.w": torch.zeros(1)}}, {"grads": {"layers.1.w": torch.ones(1)}}]
    assert {k: float(v) for k, v in assemble_grads(ranks, mesh).items()} == {"layers.0.w": 0.0, "layers.1.w": 1.0}
    assert replicas_agree(ranks, mesh) == 0.0
    ranks[3]["grads"]["layers.1.w"] = torch.full((1,), 3.0)
    assert replicas_agree(ranks, mesh) == 2.0


def test_stages_hold_equal_contiguous_runs_of_layers():
    shape = StackShape(layers=4)
    assert [stage_layers(shape, 2, s) for s in (0, 1)] == [[0, 1], [2, 3]]
