"""The planner picks what to run here: its ranking within the runner's space on measured specs, top three plus the
worst and a middle one."""
import pytest

from labkit.plan.planner import Space
from labkit.plan.runnable import AXES, TOP, compute_share, cover_axes, layout_axes, machine_specs, pick_runs, rank_runnable
from labkit.plan.score_runs import RUNNABLE, ScoreConfig, runs_here
from labkit.plan.specs import Layout

DP_TP = Space(pp=(1,), cp=(1,), zero=(0,), micro_batches=(1, 2), checkpointing=(False, True))
CFG = ScoreConfig(layers=2, d_model=64, heads=4, seq_len=16, global_batch=8)


def _calibration(ranks=4, per_node=2, inter_beta=1e-7):
    fast, slow = {"alpha_s": 1e-5, "beta_s_per_byte": 1e-9}, {"alpha_s": 1e-4, "beta_s_per_byte": inter_beta}
    return [{"rank": r, "per_node": per_node, "matmul_flops_per_s": 1e10, "link": {"intra": fast, "inter": slow},
             "compute_only_s": {"1": 0.04, "2": 0.02, "4": 0.01}} for r in range(ranks)]


def test_pick_runs_takes_the_top_three_the_worst_and_a_middle_one():
    assert pick_runs(list(range(6))) == [0, 1, 2, 4, 5]
    assert pick_runs(list(range(11))) == [0, 1, 2, 6, 10]
    assert pick_runs(list(range(4))) == [0, 1, 2, 3]
    assert len(pick_runs(list(range(20)), others=3)) == TOP + 3


def test_the_ranking_stays_in_the_runnable_space_and_is_fastest_first():
    ranked = rank_runnable(_calibration(), CFG, RUNNABLE, runs=lambda lay: runs_here(CFG, lay, 4))
    labels = {p.layout.label() for p in ranked}
    plain = {f"dp{4 // t} tp{t} pp1 cp1 zero0 mb{8 // (4 // t) // m}" + c
             for t in (1, 2, 4) for m in (1, 2) for c in ("", " ckpt")}
    assert plain < labels and all(runs_here(CFG, p.layout, 4) for p in ranked)
    assert {a for p in ranked for a in layout_axes(p.layout)} == set(AXES)
    assert not any(p.layout.pp > 1 and p.layout.cp > 1 for p in ranked)          # the runner has no pp x cp
    assert [p.step_s for p in ranked] == sorted(p.step_s for p in ranked)


def test_the_picks_cover_every_axis_the_planner_predicts():
    ranked = rank_runnable(_calibration(), CFG, RUNNABLE, runs=lambda lay: runs_here(CFG, lay, 4))
    picked = cover_axes(ranked, pick_runs(ranked))
    assert picked[:TOP] == [0, 1, 2] and len(ranked) - 1 in picked
    assert {a for i in picked for a in layout_axes(ranked[i].layout)} == set(AXES)
    assert cover_axes(ranked, list(range(len(ranked)))) == list(range(len(ranked)))      # nothing added twice


def test_layout_axes_and_compute_share():
    assert layout_axes(Layout(dp=2, tp=2, zero=3)) == ("tp", "zero3") and layout_axes(Layout(dp=2)) == ("dp",) and layout_axes(Layout()) == ()
    assert compute_share(Layout(dp=2, pp=2, tp=1)) == 4 and compute_share(Layout(cp=2, tp=2)) == 2


def test_a_slow_inter_node_link_keeps_tp_inside_a_node_and_the_full_gradient_sync_last():
    ranked = rank_runnable(_calibration(inter_beta=1e-5), CFG, DP_TP)
    assert ranked[0].layout.label() == "dp2 tp2 pp1 cp1 zero0 mb4"
    assert ranked[-1].layout.dp == 4 and ranked[-1].layout.checkpointing


def test_the_efficiency_is_measured_at_each_dp_share():
    assert machine_specs(_calibration(), CFG, 4)[1].efficiency == pytest.approx(
        machine_specs(_calibration(), CFG, 1)[1].efficiency)
    assert machine_specs(_calibration(), CFG, 2)[2].world_size == 4


def test_an_empty_space_gets_one_clear_message():
    with pytest.raises(ValueError, match="within pp in \\(3,\\)"):
        rank_runnable(_calibration(), CFG, Space(pp=(3,)))
