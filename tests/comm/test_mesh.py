"""The one mesh: hand-worked grids, the builders it replaces, every divisibility rule, and its process groups on 4
real gloo ranks all-reducing within exactly their members."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from labkit.cluster.tp_mesh import mesh_members
from labkit.comm.launch import RUN_DIR_PREFIX, launch
from labkit.comm.mesh import AXES, Mesh, device_mesh, group_plan, process_groups, seq_divisor
from labkit.plan.score_runs import mesh_groups
from labkit.plan.specs import Layout


def test_dp2_tp2_worked_by_hand():
    mesh = Mesh(dp=2, tp=2)
    assert mesh.world_size == 4 and mesh.shape == (2, 1, 1, 2)
    assert mesh.members("tp") == [[0, 1], [2, 3]]            # tp fastest: consecutive ranks, inside a node
    assert mesh.members("dp") == [[0, 2], [1, 3]]
    assert mesh.members("pp") == [[0], [1], [2], [3]]
    assert mesh.coords(3) == {"dp": 1, "pp": 0, "cp": 0, "tp": 1}
    assert mesh.rank_of(dp=1, tp=0) == 2 and mesh.group_of(2, "dp") == [0, 2]


def test_a_16_rank_grid_is_picotrons_view_dp_pp_cp_tp():
    mesh = Mesh(dp=2, pp=2, cp=2, tp=2)
    grid = torch.arange(16).view(2, 2, 2, 2)                 # picotron: arange(world).view(dp, pp, cp, tp)
    for rank in range(16):
        c = mesh.coords(rank)
        assert int(grid[c["dp"], c["pp"], c["cp"], c["tp"]]) == rank == mesh.rank_of(**c)
    assert mesh.members("cp")[0] == [0, 2] and mesh.members("pp")[0] == [0, 4] and mesh.members("dp")[0] == [0, 8]
    assert mesh.members(("dp", "cp"))[0] == [0, 2, 8, 10]     # gradient reduction and ZeRO/FSDP span dp x cp
    for axis in (*AXES, ("dp", "cp")):                        # every axis partitions the ranks
        assert sorted(r for g in mesh.members(axis) for r in g) == list(range(16))


def test_it_reproduces_the_two_builders_it_replaces():
    mesh = Mesh(dp=2, tp=2)
    assert mesh_members("tp_inside", nodes=2, per_node=2) == (mesh.members("tp"), mesh.members("dp"))
    assert mesh_groups(Layout(dp=2, tp=2), 4) == (mesh.members("tp"), mesh.members("dp"))
    assert mesh_groups(Layout(dp=1, tp=4), 4) == (Mesh(tp=4).members("tp"), Mesh(tp=4).members("dp"))


def test_expert_groups_are_consecutive_ranks_of_a_dp_x_cp_group():
    mesh = Mesh(dp=2, cp=2, ep=2)
    assert mesh.members(("dp", "cp")) == [[0, 1, 2, 3]]
    assert mesh.members("ep") == [[0, 1], [2, 3]]
    assert Mesh(dp=4, tp=2, ep=4).members("ep") == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_the_grid_needs_no_torch():
    code = "import sys, labkit.comm.mesh as m; m.Mesh(tp=2).members('dp'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_from_world_fills_dp():
    assert Mesh.from_world(8, tp=2, pp=2) == Mesh(dp=2, pp=2, tp=2)
    with pytest.raises(ValueError, match="must divide world_size=6"):
        Mesh.from_world(6, tp=4)


@pytest.mark.parametrize("kwargs, match", [({"tp": 0}, "tp"), ({"dp": 1.5}, "dp"), ({"dp": 3, "ep": 2}, "ep=2 must divide")])
def test_degrees_are_checked_once_when_made(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Mesh(**kwargs)


def test_coordinates_off_the_grid_are_refused():
    with pytest.raises(ValueError, match="rank must be"):
        Mesh(tp=2).coords(2)
    with pytest.raises(ValueError, match="tp=2 is off the grid"):
        Mesh(tp=2).rank_of(tp=2)
    with pytest.raises(ValueError, match="unknown axes"):
        Mesh(tp=2).rank_of(xp=0)


@pytest.mark.parametrize("mesh, sizes, rule", [
    (Mesh(tp=4), {"heads": 6}, "tp: heads=6 must be divisible by tp=4"),
    (Mesh(tp=4), {"kv_heads": 2}, "tp: kv_heads=2 must be divisible by tp=4"),
    (Mesh(pp=4), {"layers": 6}, "pp: layers=6 must be divisible by pp=4"),
    (Mesh(pp=4), {"layers": 3, "uneven_layers": True}, "pp: layers=3 < pp=4"),
    (Mesh(tp=2), {"seq_len": 9}, "seq: seq_len=9 must be divisible by tp=2 (sequence parallelism) = 2"),
    (Mesh(cp=2), {"seq_len": 6}, "seq: seq_len=6 must be divisible by 2*cp=4 (zig-zag causal split) = 4"),
    (Mesh(dp=4), {"batch": 6}, "dp: global batch=6 must be divisible by dp=4"),
    (Mesh(dp=2, ep=2), {"experts": 3}, "ep: experts=3 must be divisible by ep=2"),
])
def test_each_rule_rejects_its_violation_in_one_line_with_a_fix(mesh, sizes, rule):
    problems = mesh.model_problems(**sizes)
    assert len(problems) == 1 and problems[0].startswith(rule) and "fix:" in problems[0], problems
    with pytest.raises(ValueError, match="does not fit the mesh"):
        mesh.check_model(**sizes)


def test_rules_ask_only_about_axes_in_use_and_a_fitting_model_passes():
    assert Mesh(dp=2).model_problems(heads=3, kv_heads=1, layers=3, seq_len=7, batch=4, experts=5) == []
    assert Mesh(pp=2).model_problems(layers=3, uneven_layers=True) == []
    mesh = Mesh(dp=2, pp=2, cp=2, tp=2)
    assert mesh.check_model(heads=4, kv_heads=2, layers=4, seq_len=64, batch=8) is mesh
    assert seq_divisor(2, 2) == 8 and seq_divisor(1, 1) == 1       # torchtitan's seq_len_divisor: tp x 2cp
    assert len(mesh.model_problems(heads=3, kv_heads=3, layers=3, seq_len=12, batch=3)) == 5


def test_every_rank_creates_the_same_groups_in_the_same_order():
    plan = group_plan(Mesh(dp=2, tp=2))
    assert plan[:2] == [("dp", [0, 2]), ("dp", [1, 3])] and ("tp", [0, 1]) in plan and ("dp_cp", [0, 2]) in plan


def sum_within_each_axis(mesh_dicts: list[dict]) -> list[dict]:
    """On a rank, for each mesh: every axis's group all-reduces the rank number; the sums and the group members."""
    results = []
    for mesh_dict in mesh_dicts:
        out = {}
        for key, axis in process_groups(Mesh(**mesh_dict)).items():
            t = torch.tensor([float(dist.get_rank())])
            dist.all_reduce(t, group=axis.group)
            out[key] = (float(t), list(axis.ranks), axis.index)
        dm = device_mesh(Mesh(**mesh_dict))
        out["device_mesh"] = {name: dist.get_process_group_ranks(dm[name].get_group()) for name in dm.mesh_dim_names}
        results.append(out)
    return results


def test_process_groups_on_4_gloo_ranks_reduce_within_exactly_their_members():
    meshes = [Mesh(dp=2, tp=2), Mesh(pp=2, cp=2, ep=2)]
    before = set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*"))
    results = launch(sum_within_each_axis, 4, args=([vars(m) for m in meshes],), timeout_s=90, show_output=False,
                     backend="gloo")
    for rank, per_mesh in enumerate(results):
        for mesh, got in zip(meshes, per_mesh):
            on_torch = got.pop("device_mesh")          # torch's DeviceMesh: the axes > 1, the same groups
            assert {axis: sorted(r) for axis, r in on_torch.items()} == \
                {axis: mesh.group_of(rank, axis) for axis in mesh.active_axes()}
            assert set(got) == {"dp", "pp", "cp", "tp", "dp_cp", "ep"}
            for key, (total, ranks, index) in got.items():
                axis = tuple(key.split("_")) if "_" in key else key
                assert ranks == mesh.group_of(rank, axis) and ranks[index] == rank
                assert total == sum(ranks), (mesh, rank, key, total, ranks)   # the rival: the world's sum, 6
    assert psutil.Process().children(recursive=True) == []
    assert set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*")) == before


def test_process_groups_refuse_a_world_of_another_size(monkeypatch):
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(ValueError, match="holds 4 ranks but the process group has 2"):
        process_groups(Mesh(dp=2, tp=2))
