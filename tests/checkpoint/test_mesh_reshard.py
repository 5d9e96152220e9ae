"""A checkpoint saved on a dp2 x tp2 mesh (FSDP2 x parallelize_module) loads exactly on dp4 x tp1 and on dp1 x tp2,
and training continues with the uninterrupted run's losses."""
import os
import tempfile
from pathlib import Path

import psutil
import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.checkpoint.mesh_reshard import LOADED_ON, SAVED_ON, copied, reshard_rows, run_mesh_reshard, tp_plan
from labkit.checkpoint.trainer import CheckpointConfig


def test_the_plan_is_megatrons_pair_then_a_gathered_classifier():
    plan = tp_plan()
    assert isinstance(plan["0"], ColwiseParallel) and isinstance(plan["2"], RowwiseParallel)
    assert isinstance(plan["4"], ColwiseParallel)
    assert SAVED_ON.label() == "dp2 x tp2" and [m.label() for m in LOADED_ON] == ["dp4", "tp2"]


def test_copied_state_does_not_alias_the_live_tensors():
    live = torch.zeros(3)
    state = copied({"a": {"b": [live, 1]}})
    live += 1
    assert state["a"]["b"][0].sum() == 0 and state["a"]["b"][1] == 1


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("mesh_reshard")
    before = {p.name for p in Path(tempfile.gettempdir()).glob(f"labkit-launch-{os.getpid()}-*")}
    out = run_mesh_reshard(CheckpointConfig.smoke(), root)
    after = {p.name for p in Path(tempfile.gettempdir()).glob(f"labkit-launch-{os.getpid()}-*")}
    return {"run": out, "root": root, "new_launch_folders": after - before}


def test_loaded_on_another_split_exactly_and_training_continues(run):
    rows = {r["split"]: r for r in reshard_rows(run["run"])}
    for mesh in LOADED_ON:
        assert rows[mesh.label()]["state_differences"] == 0, rows
        # 1e-12: float64 losses of order 1; another split sums the partial products in another order (ulps)
        assert rows[mesh.label()]["max_loss_gap"] <= 1e-12, rows


def test_each_split_really_holds_another_cut(run):
    cuts = run["run"]["cuts_by_rank"]
    shapes = {split: by_rank[0]["2.weight"]["shape"] for split, by_rank in cuts.items()}
    assert shapes == {"dp2 x tp2": (64, 64), "dp4": (32, 128), "tp2": (128, 64)}, shapes   # rival: one layout only
    assert "_StridedShard" in cuts["dp2 x tp2"][0]["0.weight"]["placements"]


def test_nothing_is_left_behind(run):
    assert psutil.Process().children(recursive=True) == []
    assert run["new_launch_folders"] == set()
    assert {p.name for p in run["root"].iterdir()} == {"step_000002"}
