"""The straggler rounds on 2 real ranks: the skewed router puts more copies on rank 0 than the balanced one, nothing
is dropped, every round is recorded; the ratios the notebook judges are computed from them (timing is judged in the
notebook through the verdicts, not here)."""
import psutil
import pytest

from labkit.parallel.experts import straggler
from labkit.core.verdict import Load
from labkit.parallel.experts.moe import MoEConfig


@pytest.fixture(scope="module")
def ranks():
    return straggler.run_straggler(MoEConfig(), 2, 128, rounds=3, timeout_s=120)


def test_the_skewed_router_makes_rank_0_hot_and_drops_nothing(ranks):
    hot, cold = straggler.hot_and_cold(ranks)
    assert hot["rank"] == 0 and cold["rank"] == 1
    for name in straggler.ROUTERS:
        assert sum(r["record"][name]["copies"][0] for r in ranks) == 2 * 128 * 2      # capacity = tokens: all kept
    assert hot["record"]["skewed"]["copies"][0] > hot["record"]["balanced"]["copies"][0]


def test_every_round_is_recorded_and_the_ratios_are_positive(ranks):
    for r in ranks:
        assert all(len(v) == 3 for rec in r["record"].values() for v in rec.values())
    assert len(straggler.compute_ratio_by_round(ranks)) == 3
    assert all(v > 0 for v in straggler.wait_share_by_round(ranks))
    rows = straggler.straggler_rows(ranks)
    assert len(rows) == 4 and straggler.straggler_load(ranks).shares.keys() == {"rank 0", "rank 1"}


def test_the_rounds_leave_no_process_behind(ranks):
    assert psutil.Process().children(recursive=True) == []


def test_the_step_slowdown_pairs_each_round_with_its_own_prediction():
    record = {"balanced": {"step_s": [1.0], "expert_s": [0.4]}, "skewed": {"step_s": [1.5], "expert_s": [1.4]}}
    other = {"balanced": {"step_s": [0.9], "expert_s": [0.3]}, "skewed": {"step_s": [1.2], "expert_s": [0.1]}}
    # skewed step 1.5 / balanced 1.0; the busiest rank's experts took 1.4 - 0.4 = 1.0 s more: threshold 1 + 0.5
    assert straggler.step_slowdown_by_round([{"record": record}, {"record": other}]) == [(1.5, 1.5)]


def _two_ranks(extra_s: float, rounds: int = 3) -> list[dict]:
    """Two ranks' records: the skewed step 1.3 s against 1.0 s balanced, the busiest expert time ``extra_s`` longer."""
    hot = {"balanced": {"step_s": [1.0] * rounds, "expert_s": [0.4] * rounds},
           "skewed": {"step_s": [1.3] * rounds, "expert_s": [0.4 + extra_s] * rounds}}
    cold = {"balanced": {"step_s": [1.0] * rounds, "expert_s": [0.4] * rounds},
            "skewed": {"step_s": [1.3] * rounds, "expert_s": [0.2] * rounds}}
    return [{"rank": 0, "record": hot}, {"rank": 1, "record": cold}]


def test_the_step_slowdown_is_checked_when_the_busiest_rank_computed_more():
    verdict = straggler.judge_step_slowdown(_two_ranks(0.4), Load({"rank 0": 1.0, "rank 1": 1.0}))
    assert verdict.state == "checked" and "rules out the same tokens make the same step" in verdict.detail


def test_a_step_slowdown_with_no_extra_expert_time_is_inconclusive_when_busy_and_fails_when_quiet():
    """The threshold collapses to the rival's 1x: a busy run's load explains that, a quiet run's does not."""
    busy = straggler.judge_step_slowdown(_two_ranks(0.0), Load({"rank 0": 0.3, "rank 1": 0.9}))
    assert busy.state == "INCONCLUSIVE" and busy.kind == "load" and "0.3" in busy.detail
    quiet = straggler.judge_step_slowdown(_two_ranks(0.0), Load({"rank 0": 1.0, "rank 1": 1.0}))
    assert quiet.state == "failed" and "cannot tell" in quiet.detail
