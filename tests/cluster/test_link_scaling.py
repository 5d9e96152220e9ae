"""Sync SGD across the nodes: the speed-up predicted from T_comp and the fitted link, judged on hand-made runs."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from labkit.cluster.link_scaling import (combined_load, judge_slow_link_costs, judge_speedup, link_free_speedup,
                                         sgd_load, sgd_row, sgd_runs)
from labkit.cluster.linkfit import LinkFit
from labkit.parallel.data.scaling import StepTimes

GRAD_BYTES = 1_000_000


def _runs(t_comp_s: float, t_sync_s: float, share: float = 1.0, noise: float = 1.05) -> list[dict]:
    alone = StepTimes(1, 1024, GRAD_BYTES, t_comp_s, 0.0, t_comp_s, 0.0, 0.0, "cpu", noise, share)
    across = StepTimes(2, 1024, GRAD_BYTES, t_comp_s, t_sync_s, t_comp_s + t_sync_s, 1e-4, 4e-8, "cpu", noise, share)
    return [asdict(alone), asdict(across)]


def _results(by_rate: dict[str, list[dict]]) -> list[dict]:
    rank0 = {"rank": 0, "by_rate": {rate: {"sync_sgd": runs} for rate, runs in by_rate.items()}}
    return [{"rank": 1, "by_rate": {}}, rank0]


# a 25 MB/s link: the 2-rank ring sends n/2 twice, so T_sync = 2 alpha + n beta = 40 ms + 2 x 50 us
SLOW = LinkFit(50e-6, 1 / 25e6, 0.99)
FAST = LinkFit(50e-6, 1 / 100e6, 0.99)


def test_row_prices_the_ring_on_the_fitted_link():
    results = _results({"200": _runs(0.010, 0.040), "800": _runs(0.010, 0.010)})
    alone, across = sgd_runs(results, 200)
    assert (alone.world_size, across.world_size) == (1, 2)
    row = sgd_row(results, SLOW, 200, cores=2)
    assert row["T_sync model (ms)"] == pytest.approx(2 * 0.05 + 40.0)
    assert row["speedup model"] == pytest.approx(2 * 10 / (10 + 40.1))
    assert row["speedup measured"] == pytest.approx(2 * 10 / 50)
    fast = sgd_row(results, FAST, 800, cores=2)
    assert fast["speedup model"] > row["speedup model"] and fast["speedup measured"] > row["speedup measured"]


def test_agreement_is_checked_quiet_and_a_wrong_model_fails_even_under_load():
    results = _results({"200": _runs(0.010, 0.040)})
    row = sgd_row(results, SLOW, 200, cores=2)
    assert judge_speedup("agrees", row, sgd_load(results, 200, cores=2)).state == "checked"
    wrong = dict(row, **{"speedup model": 3 * row["speedup measured"]})     # a model 3x off
    assert judge_speedup("agrees", wrong, sgd_load(results, 200, 2)).state == "failed"
    busy = _results({"200": _runs(0.010, 0.040, share=0.7, noise=1.2)})     # explains up to 1.71x
    assert judge_speedup("agrees", wrong, sgd_load(busy, 200, 2)).state == "failed"
    slightly = dict(row, **{"speedup model": 1.7 * row["speedup measured"]})
    assert judge_speedup("agrees", slightly, sgd_load(busy, 200, 2)).state == "INCONCLUSIVE"
    assert judge_speedup("agrees", slightly, sgd_load(results, 200, 2)).state == "failed"


def test_the_slow_link_costs_speedup_in_the_model_and_on_the_clock():
    results = _results({"200": _runs(0.010, 0.040), "800": _runs(0.010, 0.010)})
    slow, fast = sgd_row(results, SLOW, 200, 2), sgd_row(results, FAST, 800, 2)
    load = combined_load([sgd_load(results, 200, 2), sgd_load(results, 800, 2)])
    assert judge_slow_link_costs("slow costs", slow, fast, load).state == "checked"
    assert judge_slow_link_costs("slow costs", fast, slow, load).state == "failed"     # the model disagrees
    clock_reversed = dict(slow, **{"speedup measured": fast["speedup measured"] * 1.5})
    assert judge_slow_link_costs("slow costs", clock_reversed, fast, load).state == "failed"
    # a neighbour that slowed the fast link's lone rounds reorders the speed-ups each priced on its own T_comp; at
    # one T_comp the link still decides, so the model's half holds and the clock decides the verdict
    slowed = dict(fast, **{"T_comp (ms)": fast["T_comp (ms)"] / 4,
                           "speedup model": slow["speedup model"] * 0.9})
    assert slowed["speedup model"] < slow["speedup model"]
    assert judge_slow_link_costs("slow costs", slow, slowed, load).state == "checked"
    assert set(load.shares) == {"the worst of 1 rank(s) (1)", "the worst of 2 rank(s) (1)",
                                "the worst of 1 rank(s) (2)", "the worst of 2 rank(s) (2)"}


def test_a_clock_that_shows_a_free_link_fails_and_a_cheap_link_is_not_checked():
    results = _results({"200": _runs(0.010, 0.040)})
    row = sgd_row(results, SLOW, 200, cores=2)
    free = link_free_speedup(row)
    assert free == pytest.approx(2.0) and row["speedup model"] == pytest.approx(0.4, rel=0.01)
    verdict = judge_speedup("agrees", row, sgd_load(results, 200, 2))
    assert verdict.state == "checked" and verdict.rival.startswith("the link costs nothing")
    rival_true = dict(row, **{"speedup measured": free})                    # the clock shows no link cost
    assert judge_speedup("agrees", rival_true, sgd_load(results, 200, 2)).state == "failed"
    cheap = sgd_row(_results({"800": _runs(0.010, 0.0001)}), LinkFit(1e-6, 1e-11, 0.99), 800, cores=2)
    verdict = judge_speedup("agrees", cheap, sgd_load(results, 200, 2))
    assert verdict.state == "NOT CHECKED" and "too cheap" in verdict.detail


def test_speed_ups_that_the_link_speed_leaves_equal_fail_the_slow_link_claim():
    results = _results({"200": _runs(0.010, 0.040), "800": _runs(0.010, 0.010)})
    slow, fast = sgd_row(results, SLOW, 200, 2), sgd_row(results, FAST, 800, 2)
    load = combined_load([sgd_load(results, 200, 2), sgd_load(results, 800, 2)])
    same = dict(slow, **{"speedup measured": fast["speedup measured"]})     # the rival: the link speed does not matter
    verdict = judge_slow_link_costs("slow costs", same, fast, load)
    assert verdict.state == "failed" and verdict.rival.startswith("the link speed does not matter")


def test_links_the_model_prices_alike_leave_the_slow_link_claim_not_checked():
    results = _results({"200": _runs(0.010, 0.040), "800": _runs(0.010, 0.010)})
    slow, fast = sgd_row(results, SLOW, 200, 2), sgd_row(results, SLOW, 800, 2)   # the same fitted link at both speeds
    load = combined_load([sgd_load(results, 200, 2), sgd_load(results, 800, 2)])
    verdict = judge_slow_link_costs("slow costs", slow, fast, load)
    assert verdict.state == "NOT CHECKED" and "within 10%" in verdict.detail
