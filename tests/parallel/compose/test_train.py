"""The timed step of every composition trains the same model: after three Adam steps on 2 gloo ranks, dp (by hand,
ZeRO-2, ZeRO-3), tp, pp (the hand GPipe with 2 micro-batches) and cp (ring attention, checkpointed) reach the loss of
one rank; the runner's limits are one sentence each."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from labkit.comm.launch import launch
from labkit.comm.mesh import AxisGroup, Mesh, my_group
from labkit.core.step import StepOptions, TrainStep
from labkit.parallel.compose.model import StackShape, probe_mean_loss, stack_inputs
from labkit.parallel.compose.train import ComposedStep, RingLayer, build_model, runner_problem
from labkit.sharding.checkpointing import Checkpointed

SHAPE = StackShape(layers=2, d_model=32, heads=2, seq_len=16, batch=4)
LAYOUTS = {"one rank": (Mesh(), 0, 4, False), "dp": (Mesh(dp=2), 0, 1, False), "zero2": (Mesh(dp=2), 2, 1, False),
           "zero3": (Mesh(dp=2), 3, 2, True), "tp": (Mesh(tp=2), 0, 2, False), "pp": (Mesh(pp=2), 0, 2, False),
           "cp": (Mesh(cp=2), 0, 2, True)}
STEPS = 3
# float32, the same sums in another order: a few ulp of the loss (~1e-7 measured); the rivals (a micro-batch
# dropped, a gradient summed instead of averaged, an update skipped) move the third step's loss by 1e-3 or more.
LOSS_RTOL = 1e-5


def losses_job(names: list[str]) -> dict[str, list]:
    """On each of 2 ranks: every named layout's loss per step (None on pipeline stage 0); 'one rank' on each rank
    alone (in a process group of its own)."""
    out: dict[str, list] = {}
    for name in names:
        mesh, zero, micro_batch, ckpt = LAYOUTS[name]
        if mesh.world_size == 1:
            out[name] = _single(micro_batch, ckpt)
            continue
        step = ComposedStep(SHAPE, mesh, zero, micro_batch, ckpt, lambda p: torch.optim.Adam(p, lr=1e-2))
        out[name] = [step() for _ in range(STEPS)]
    return out


def _single(micro_batch: int, ckpt: bool) -> list:
    alone = my_group(Mesh(dp=2).members("tp"))              # this rank alone: tp's f and g reduce over one rank
    model = build_model(SHAPE, Mesh(), {"pp": alone, "tp": alone}, ckpt)
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=1e-2), loss_fn=probe_mean_loss,
                     options=StepOptions(accumulation_steps=SHAPE.batch // micro_batch))
    x, probe = stack_inputs(SHAPE)
    return [float(step(x, probe).loss) for _ in range(STEPS)]


def test_every_composition_trains_to_the_loss_of_one_rank():
    ranks = launch(losses_job, 2, args=(list(LAYOUTS),), timeout_s=120, show_output=False, backend="gloo")
    reference = ranks[0]["one rank"]
    assert ranks[1]["one rank"] == reference
    assert reference[-1] < reference[0]                                  # it trains
    for name in LAYOUTS:
        if name == "one rank":
            continue
        per_step = [[r[name][i] for r in ranks if r[name][i] is not None] for i in range(STEPS)]
        assert all(per_step)                                            # every step's loss reached some rank
        mean = [sum(v) / len(v) for v in per_step]                      # dp and cp ranks: means of equal shares
        torch.testing.assert_close(mean, reference, rtol=LOSS_RTOL, atol=0.0, msg=lambda m, n=name: f"{n}: {m}")


def test_the_runner_says_what_it_cannot_run_in_one_sentence():
    assert runner_problem(Mesh(dp=2, tp=2), 3) is None and runner_problem(Mesh(pp=2, tp=2)) is None
    for mesh, zero, words in ((Mesh(dp=4), 1, "no ZeRO-1"), (Mesh(pp=4), 0, "two stages"),
                              (Mesh(pp=2, cp=2), 0, "no ring attention"), (Mesh(dp=2, pp=2), 2, "dp x tp here"),
                              (Mesh(tp=4), 3, "needs dp > 1")):
        problem = runner_problem(mesh, zero)
        assert problem is not None and words in problem and "\n" not in problem, problem


def test_the_model_wraps_ring_layers_and_checkpoints_each_layer():
    one = AxisGroup(None, (0,), 0)
    groups = {"pp": one, "tp": one, "cp": AxisGroup(None, (0, 1), 0)}
    model = build_model(SHAPE, Mesh(cp=2), groups, checkpointing=True)
    assert len(model) == SHAPE.layers and all(isinstance(m, Checkpointed) for m in model)
    assert all(isinstance(m.inner, RingLayer) for m in model)
    assert isinstance(build_model(SHAPE, Mesh(), {"pp": one, "tp": one}), nn.Sequential)
    with pytest.raises(ValueError, match="two stages"):
        ComposedStep(SHAPE, Mesh(pp=4))
