"""The planner's layouts on real gloo ranks: the planner picks within RUNNABLE on 2 ranks and every axis it predicts
runs (dp, tp, pp, cp, ZeRO-2, ZeRO-3); composed layouts on 4 ranks; every rank reports its memory, rounds and link
fit; nothing is left behind; a bad layout is refused in one line before any process starts."""
import os
import tempfile
from pathlib import Path

import psutil
import pytest

from labkit.comm.launch import RUN_DIR_PREFIX
from labkit.plan.runnable import AXES, layout_axes
from labkit.plan.score import (axis_memory_checks, axis_summary, layouts_run, machine_specs, memory_within_band,
                               planner_ranking, predictions, score_rows, winner_verdict)
from labkit.plan.score_runs import RUNNABLE, ScoreConfig, build_stack, mesh_groups, run_layouts, runs_here
from labkit.plan.specs import Layout

CFG = ScoreConfig(layers=2, d_model=32, heads=2, seq_len=16, global_batch=4, rounds=2)
# 2 ranks, 2 layers: dp2 (ZeRO 0, 2, 3), tp2, pp2, cp2, each x 2 micro-batch counts x checkpointing
RANKED = 3 * 4 + 3 * 4


@pytest.fixture(scope="module")
def ranks():
    """No layouts given: the ranks measure this machine and the planner picks within RUNNABLE."""
    return run_layouts(CFG, world_size=2, timeout_s=120)


@pytest.fixture(scope="module")
def composed():
    """Three composed layouts on 4 ranks, the processes before and after (nothing may be left behind)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    layouts = [Layout(dp=2, tp=2, zero=3, micro_batch=1, checkpointing=True), Layout(pp=2, tp=2, micro_batch=2),
               Layout(cp=2, tp=2, micro_batch=2, checkpointing=True)]
    out = run_layouts(CFG, layouts, world_size=4, timeout_s=120)
    return out, layouts, before, {p.pid for p in psutil.Process().children(recursive=True)}


def test_the_planner_picked_what_ran_within_the_runnable_space_and_every_axis_ran(ranks):
    ran = layouts_run(ranks)
    assert len(ranks[0]["ranking"]) == RANKED
    assert all(r["ranking"] == ranks[0]["ranking"] for r in ranks)     # every rank ran the same picks
    rows = score_rows(ranks, predictions(ranks, CFG, ran))
    assert sorted(r["predicted rank"] for r in rows)[:3] == [1, 2, 3] and max(r["predicted rank"] for r in rows) == RANKED
    assert [r["run"] for r in planner_ranking(ranks)].count(True) == len(ran) >= 5
    assert all(RUNNABLE.allows(machine_specs(ranks, CFG, 1)[0], lay) for lay in ran)
    assert {a for lay in ran for a in layout_axes(lay)} == set(AXES)            # the rival: dp x tp only
    assert all(s["layouts"] >= 1 for s in axis_summary(rows))


def test_every_rank_reports_every_layout(ranks):
    for r in ranks:
        assert set(r["memory"]) == set(r["seconds"]) == {lay.label() for lay in layouts_run(ranks)}
        assert all(len(v) == CFG.rounds for v in r["seconds"].values())
        assert r["link"]["intra"]["beta_s_per_byte"] >= 0 and r["matmul_flops_per_s"] > 0


def test_the_planner_predicts_what_the_ranks_hold_on_every_axis_and_rejects_each_rival(ranks):
    rows = score_rows(ranks, predictions(ranks, CFG, layouts_run(ranks)))
    assert memory_within_band(rows), rows
    checks = axis_memory_checks(ranks, CFG, rows)
    assert [c["axis"] for c in checks] == list(AXES)
    assert all(c["within band"] and c["rival rejected"] for c in checks), checks
    assert winner_verdict(ranks, rows).state in ("checked", "failed", "INCONCLUSIVE", "NOT CHECKED")
    assert machine_specs(ranks, CFG, 2)[1].efficiency <= 1.0


def test_composed_layouts_run_on_four_ranks_measured_and_leave_nothing(composed):
    out, layouts, before, after = composed
    assert after - before == set()
    assert not list(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*"))
    rows = score_rows(out, predictions(out, CFG, layouts))
    assert [r["axes"] for r in rows] == ["tp zero3", "tp pp", "tp cp"]
    assert memory_within_band(rows), rows
    zero3 = out[0]["memory"][layouts[0].label()]
    assert zero3["params"] * 4 < build_stack_bytes() * 1.1          # 1/(tp dp) of the stack: ZeRO-3 shards weights
    stages = [r["memory"][layouts[1].label()]["activations"] for r in out]
    assert stages[0] == 2 * stages[2] > 0     # stage 0 recomputes both micro-batches at once, stage 1 one at a time


def build_stack_bytes() -> int:
    return sum(p.numel() * 4 for p in build_stack(CFG, Layout()).parameters())


def test_mesh_groups_and_clear_errors():
    assert mesh_groups(Layout(dp=2, tp=2), 4) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    with pytest.raises(ValueError, match="the hand-written GPipe runs no ring attention"):
        run_layouts(CFG, [Layout(pp=2, cp=2)], world_size=4)
    with pytest.raises(ValueError, match="FSDP2 has no ZeRO-1|choose zero in"):
        run_layouts(CFG, [Layout(dp=2, zero=1)], world_size=2)
    with pytest.raises(ValueError, match="dp x tp x pp x cp = 2 ranks"):
        run_layouts(CFG, [Layout(dp=4)], world_size=2)
    assert not runs_here(CFG, Layout(dp=2, pp=2, zero=2), 4) and runs_here(CFG, Layout(pp=2, tp=2), 4)
    assert len(build_stack(CFG, Layout(checkpointing=True))) == CFG.layers


def test_the_emulated_nodes_run_refuses_a_bad_layout_before_building_nodes():
    from labkit.plan.score_runs import run_layouts_on_nodes

    with pytest.raises(ValueError, match="dp x tp x pp x cp = 4"):
        run_layouts_on_nodes(CFG, [Layout(dp=2)])


def test_a_shape_the_layout_cannot_split_is_one_line_before_any_rank_starts():
    """Issue 53: ScoreConfig(heads=3) failed with 28 lines from inside the ranks; issue 50: the runner asks the
    mesh's rules (the ones the planner asks), not a rule of its own."""
    with pytest.raises(ValueError, match="d_model=128 must be divisible by heads=3"):
        ScoreConfig(heads=3)
    with pytest.raises(ValueError, match=r"tp: heads=6 must be divisible by tp=4") as err:
        run_layouts(ScoreConfig(d_model=96, heads=6), [Layout(tp=4)], world_size=4, timeout_s=5)
    assert "fix: tp in" in str(err.value)
    with pytest.raises(ValueError, match=r"dp: global batch=6 must be divisible by dp=4"):
        run_layouts(ScoreConfig(global_batch=6), [Layout(dp=4)], world_size=4, timeout_s=5)
    for bad, match in ((Layout(pp=4), "two stages"), (Layout(cp=2, dp=2), "seq_len=18 must be divisible")):
        with pytest.raises(ValueError, match=match) as err:
            run_layouts(ScoreConfig(seq_len=18), [bad], world_size=4, timeout_s=5)
        assert len(str(err.value).splitlines()) <= 2
