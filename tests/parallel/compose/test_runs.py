"""Each composition equals one process in loss and every gradient; the bytes per axis equal the formula and not
its rival; a run past its timeout leaves nothing behind."""
from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import psutil
import pytest

from labkit.comm.launch import RUN_DIR_PREFIX, LaunchTimeout
from labkit.parallel.compose.model import StackShape
from labkit.parallel.compose.runs import (bytes_rows, check_equal, local_params, predicted_bytes, rival_bytes,
                                          run_compositions)
from labkit.parallel.compose.steps import COMPOSITIONS

SHAPE = StackShape.fast()


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_each_composition_equals_one_process(composed, name):
    ranks, reference = composed
    errors = check_equal(name, ranks, reference)              # assert_close on the loss and every gradient
    assert errors["max_grad_error"] < 1e-5 * errors["largest_grad"] and errors["replica_spread"] == 0.0


@pytest.mark.parametrize("name", ["dp x tp", "tp x cp", "dp x pp"])
def test_a_gradient_off_by_the_rival_is_caught(composed, name):
    ranks, reference = composed
    wrong = copy.deepcopy(ranks)
    for r in wrong:                                           # the rival: summed over dp x cp, not averaged
        for g in r[name]["grads"].values():
            g.mul_(2)
    with pytest.raises(AssertionError):
        check_equal(name, wrong, reference)


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_bytes_per_axis_equal_the_formula_on_every_rank_and_not_the_rival(composed, name):
    ranks, _ = composed
    rows = bytes_rows(name, ranks, SHAPE)
    assert {row["axis"] for row in rows} == set(predicted_bytes(name, SHAPE))
    for row in rows:
        assert row["measured_bytes"] == row["predicted_bytes"] and row["ranks_off_formula"] == 0, row
        assert abs(row["rival_bytes"] - row["predicted_bytes"]) >= 0.25 * row["predicted_bytes"], row
    for r in ranks:                                           # no traffic on an axis the formula does not expect
        assert {a for a, b in r[name]["bytes"].items() if b} == set(predicted_bytes(name, SHAPE))


def test_the_formulas_worked_by_hand():
    h = SHAPE.d_model                                          # 64; batch 4, seq 32, 2 layers
    assert local_params(SHAPE, 1) == 12 * h * h + 13 * h       # the whole layer: 4 linears h x h, MLP 8h^2, norms
    act = 2 * 32 * 64 * 4                                      # dp x tp: b/dp x s x h float32
    assert predicted_bytes("dp x tp", SHAPE) == {"tp": 2 * 4 * act, "dp": 2 * local_params(SHAPE, 2) * 4}
    assert predicted_bytes("dp x pp", SHAPE)["pp"] == act      # each stage sends its dp share once
    assert predicted_bytes("tp x cp", SHAPE)["cp"] == 2 * 4 * (2 * 4 * 16 * 32 * 4)   # 3c-2 = 4 K/V passes a layer
    assert rival_bytes("fsdp x tp", SHAPE)["dp"][0] == 1.5 * predicted_bytes("fsdp x tp", SHAPE)["dp"]
    tp_pp = predicted_bytes("pp x tp", SHAPE, stage=0)["tp"]   # stage 0 recomputes: 6 all-reduces a layer, not 4
    assert tp_pp == 6 * 4 * 32 * 64 * 4 and predicted_bytes("pp x tp", SHAPE, stage=1)["tp"] == tp_pp * 4 / 6


def test_the_mesh_rules_refuse_a_shape_before_any_process_starts():
    with pytest.raises(ValueError, match="seq: seq_len=6 must be divisible by"):
        run_compositions(StackShape(seq_len=6), ["tp x cp"])
    with pytest.raises(ValueError, match="unknown compositions"):
        run_compositions(SHAPE, ["dp x ep"])


def test_a_run_past_its_timeout_is_killed_and_leaves_no_process_or_folder():
    before = set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*"))
    with pytest.raises(LaunchTimeout):
        run_compositions(SHAPE, ["dp x tp"], timeout_s=0.3)
    assert psutil.Process().children(recursive=True) == []
    assert set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*")) == before
