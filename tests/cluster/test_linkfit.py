"""Fitting alpha and beta: exact on model data, refuses what cannot be fitted; the summary of a node-lab job."""
from __future__ import annotations

import pytest

from labkit.cluster.linkfit import (allreduce_summary, expected_payload_bytes_s, fit_alpha_beta, fit_links, link_spread,
                                    rates_by_repeat)


def test_fit_recovers_alpha_and_beta_from_model_times():
    sizes = [2**16, 2**18, 2**20, 2**21]
    fit = fit_alpha_beta(sizes, [5e-5 + n * 4e-8 for n in sizes])
    assert fit.alpha_s == pytest.approx(5e-5) and fit.beta_s_per_byte == pytest.approx(4e-8)
    assert fit.r_squared == pytest.approx(1.0) and fit.bandwidth_bytes_s == pytest.approx(25e6)
    assert fit.link().alpha_s == pytest.approx(5e-5)


def test_fit_refuses_too_few_sizes_and_times_that_do_not_grow():
    with pytest.raises(ValueError, match="at least two different sizes"):
        fit_alpha_beta([10, 10], [1.0, 2.0])
    with pytest.raises(ValueError, match="too noisy to fit"):
        fit_alpha_beta([10, 20], [2.0, 1.0])


def test_fit_links_takes_alpha_from_the_tiny_message_and_beta_from_the_slope():
    # a shaped link: the first 500 B pass at once (tbf's burst), so the large-message line starts below zero
    pings = {"inter": {"8": [2e-3, 2e-3, 9.0], "1000": [0.5, 0.501, 99.0], "2000": [1.5, 1.499, 0.0]}}
    fit = fit_links(pings)["inter"]
    assert fit.beta_s_per_byte == pytest.approx(1e-3, rel=1e-2)
    assert fit.alpha_s == 0.0                     # 2 ms - 8 B x 1 ms/B < 0: clipped at zero
    assert fit_links({"x": {"8": [1.0], "1000": [1.5], "2000": [2.5]}})["x"].alpha_s == pytest.approx(1.0 - 8e-3)
    with pytest.raises(ValueError, match="need a tiny message"):
        fit_links({"x": {"1000": [1.0], "2000": [2.0]}})


def test_expected_payload_of_a_shaped_link():
    assert expected_payload_bytes_s(200) == pytest.approx(25e6 * 1448 / 1514)


def _rank(rank: int, flat_s: float, hier_s: float, exact: bool = True) -> dict:
    rounds = {"flat": [[9.0, 0, True]] + [[flat_s * (1 + rank / 10), 1500, exact]] * 3,
              "hierarchical": [[9.0, 0, True]] + [[hier_s, 1000, True]] * 3}
    return {"local_world_size": 2, "allreduce": {"4096": rounds}}


def test_allreduce_summary_uses_the_slowest_rank_and_drops_the_warm_up_round():
    summary = allreduce_summary([_rank(r, 0.3, 0.2) for r in range(4)])[4096]
    assert summary["flat_s"] == pytest.approx(0.39) and summary["hierarchical_s"] == pytest.approx(0.2)
    assert summary["hier_over_flat"] == pytest.approx(0.2 / 0.39)
    assert summary["flat_node_tx_bytes"] == 1500 and summary["hierarchical_node_tx_bytes"] == 1000
    assert summary["exact"] and summary["round_spread"] == pytest.approx(1.0)   # the same ratio every round
    assert not allreduce_summary([_rank(0, 0.3, 0.2, exact=False)])[4096]["exact"]


def test_the_link_spread_is_how_far_the_repeats_own_rates_disagree():
    steady = {"8": [1e-4] * 3, "1000": [1.0, 1.0, 1.0], "2000": [2.0, 2.0, 2.0]}
    assert link_spread(steady) == 0.0
    # repeat 1 took twice as long at the largest size: its own rate is a third of the others'
    noisy = {"8": [1e-4] * 3, "1000": [1.0, 1.0, 1.0], "2000": [2.0, 4.0, 2.0]}
    assert link_spread(noisy) > 0.5
    assert rates_by_repeat(noisy) == pytest.approx([1000.0, 1000.0 / 3, 1000.0])
