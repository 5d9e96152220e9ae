"""Tensor and sequence parallelism on 2 real gloo ranks: equal to the unsplit layer, the collectives and bytes
the formulas say, activations cut as the paper says; and a run past its timeout leaves nothing behind."""
import os
import tempfile
from pathlib import Path

import psutil
import pytest

from labkit.comm.launch import RUN_DIR_PREFIX, LaunchTimeout
from labkit.parallel.tensor import cost as tp_cost
from labkit.parallel.tensor.megatron import LayerShape
from labkit.parallel.tensor.runs import layer_inputs, one_step, run_tensor_parallel
from labkit.parallel.tensor.megatron import build_block

SHAPE = LayerShape(seq_len=32, batch=2)


@pytest.fixture(scope="module")
def ranks():
    return run_tensor_parallel(SHAPE, 2, timeout_s=120)


@pytest.mark.parametrize("kind", ["tp", "sp", "dtensor_tp", "dtensor_sp"])
def test_every_split_equals_the_unsplit_layer(ranks, kind):
    for r in ranks:
        assert r[kind]["out_diff"] < 1e-5 and r[kind]["x_grad_diff"] < 1e-5 and r[kind]["grad_diff"] < 1e-5, r[kind]


def test_one_all_reduce_per_block_each_way_and_sequence_parallel_swaps_it(ranks):
    tp_phases, sp_phases = ranks[0]["tp"]["phases"], ranks[0]["sp"]["phases"]
    assert tp_phases["forward"]["calls"] == {"all_reduce": 2, "reduce_scatter": 0, "all_gather": 0}
    assert tp_phases["backward"]["calls"] == {"all_reduce": 2, "reduce_scatter": 0, "all_gather": 0}
    assert sp_phases["forward"]["calls"] == {"all_reduce": 0, "reduce_scatter": 2, "all_gather": 2}
    assert sp_phases["backward"]["calls"] == {"all_reduce": 0, "reduce_scatter": 2, "all_gather": 4}  # + re-gather
    assert ranks[0]["dtensor_tp"]["comm_forward"] == {"all_reduce": 2}
    assert ranks[0]["dtensor_tp"]["comm_backward"] == {"all_reduce": 2}


def test_nominal_and_wire_bytes_follow_the_formula_and_gloo_s_reduce_scatter(ranks):
    per_layer = tp_cost.tp_bytes_per_layer(SHAPE.batch, SHAPE.seq_len, SHAPE.d_model, 2)
    phases = ranks[0]["tp"]["phases"]
    assert phases["forward"]["nominal_bytes"] + phases["backward"]["nominal_bytes"] == per_layer
    wire = phases["forward"]["wire_bytes"] + phases["backward"]["wire_bytes"]
    assert per_layer <= wire <= 1.1 * per_layer
    sp_forward = ranks[0]["sp"]["phases"]["forward"]["wire_bytes"]
    assert sp_forward >= 1.4 * phases["forward"]["wire_bytes"]      # gloo: a reduce-scatter costs an all-reduce


def test_each_rank_holds_half_the_matrices_and_sequence_parallel_halves_the_norm_region(ranks):
    h = SHAPE.d_model
    r = ranks[0]
    replicated = 6 * h                                   # two norms (4h) and the two row-parallel biases (2h)
    assert r["tp"]["params"] == (r["unsplit_params"] - replicated) // 2 + replicated
    assert r["tp"]["saved"]["norm"] == r["unsplit_saved"]["norm"] == tp_cost.norm_region_bytes(32, 2, h)
    assert r["sp"]["saved"]["norm"] * 2 == r["unsplit_saved"]["norm"]
    assert r["tp"]["saved"]["split"] * 2 == r["unsplit_saved"]["split"] == r["sp"]["saved"]["split"] * 2


def test_one_step_without_a_group_gives_the_gradients_of_every_parameter():
    block = build_block(SHAPE)
    x, probe = layer_inputs(SHAPE)
    run = one_step(block, x, probe)
    assert set(run["grads"]) == {n for n, _ in block.named_parameters()}
    assert run["x_grad"].shape == x.shape and run["phases"]["forward"]["nominal_bytes"] == 0


def test_a_run_past_its_timeout_is_killed_and_leaves_no_process_or_folder():
    before = set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*"))
    with pytest.raises(LaunchTimeout):
        run_tensor_parallel(SHAPE, 2, timeout_s=0.3)
    assert psutil.Process().children(recursive=True) == []
    assert set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*")) == before
