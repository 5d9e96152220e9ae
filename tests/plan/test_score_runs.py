"""Two layouts of the kit's layer on 2 real gloo ranks: every rank reports its memory, rounds and link fit; a bad
layout is refused before any process starts."""
import pytest

from labkit.plan.score import (layouts_run, machine_specs, memory_within_band, planner_ranking, predictions,
                               score_rows, winner_verdict)
from labkit.plan.score_runs import RUNNABLE, ScoreConfig, build_stack, mesh_groups, run_layouts
from labkit.plan.specs import Layout

CFG = ScoreConfig(layers=1, d_model=32, heads=2, seq_len=16, global_batch=4, rounds=2)
LAYOUTS = [Layout(dp=2, micro_batch=2), Layout(tp=2, micro_batch=4, checkpointing=True)]


@pytest.fixture(scope="module")
def ranks():
    """No layouts given: the ranks measure this machine and the planner picks within RUNNABLE (8 layouts here)."""
    return run_layouts(CFG, world_size=2, timeout_s=120)


def test_the_planner_picked_what_ran_within_the_runnable_space(ranks):
    ran = layouts_run(ranks)
    assert len(ranks[0]["ranking"]) == 8 and len(ran) == 5                 # tp 1|2 x ckpt x 1|2 micro-batches
    assert all(r["ranking"] == ranks[0]["ranking"] for r in ranks)     # every rank ran the same picks
    rows = score_rows(ranks, predictions(ranks, CFG, ran))
    assert sorted(r["predicted rank"] for r in rows)[:3] == [1, 2, 3] and max(r["predicted rank"] for r in rows) == 8
    assert [r["run"] for r in planner_ranking(ranks)].count(True) == 5
    assert all(RUNNABLE.allows(machine_specs(ranks, CFG, 1)[0], lay) for lay in ran)


def test_every_rank_reports_every_layout(ranks):
    for r in ranks:
        assert set(r["memory"]) == set(r["seconds"]) == {lay.label() for lay in layouts_run(ranks)}
        assert all(len(v) == CFG.rounds for v in r["seconds"].values())
        assert r["link"]["intra"]["beta_s_per_byte"] >= 0 and r["matmul_flops_per_s"] > 0


def test_the_planner_predicts_what_the_ranks_hold(ranks):
    rows = score_rows(ranks, predictions(ranks, CFG, layouts_run(ranks)))
    assert memory_within_band(rows), rows
    assert winner_verdict(ranks, rows).state in ("checked", "failed", "INCONCLUSIVE")
    assert machine_specs(ranks, CFG, 2)[1].efficiency <= 1.0


def test_mesh_groups_and_clear_errors():
    assert mesh_groups(Layout(dp=2, tp=2), 4) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    with pytest.raises(ValueError, match="pp = cp = 1"):
        run_layouts(CFG, [Layout(pp=2)], world_size=2)
    assert len(build_stack(CFG, Layout(checkpointing=True))) == CFG.layers


def test_the_emulated_nodes_run_refuses_a_bad_layout_before_building_nodes():
    from labkit.plan.score_runs import run_layouts_on_nodes

    with pytest.raises(ValueError, match="dp x tp = 4"):
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
