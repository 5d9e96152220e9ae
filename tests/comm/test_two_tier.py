"""The two-level all-reduce in the simulator: exact for every layout and op, less over the slow link, and the
two-tier alpha-beta model worked by hand."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.comm.collectives import OPS, allreduce, reference_allreduce
from labkit.comm.two_tier import (Link, hierarchical_allreduce, inter_node_bytes, predicted_times_s, two_tier_cost_s,
                                  two_tier_time_s)


@st.composite
def layouts(draw, dtype=np.int64):
    nodes, per_node = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    length, op = draw(st.integers(0, 30)), draw(st.sampled_from(OPS))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    arrays = [rng.integers(-1000, 1000, size=length).astype(dtype) for _ in range(nodes * per_node)]
    return per_node, op, arrays


@settings(max_examples=200, deadline=None, derandomize=True)
@given(layouts())
def test_every_worker_gets_the_exact_reduction(case):
    per_node, op, arrays = case
    copies = [a.copy() for a in arrays]
    result = hierarchical_allreduce(arrays, per_node, op)
    exact = reference_allreduce(arrays, op)
    assert result.world_size == len(arrays)
    for out in result.outputs:
        np.testing.assert_array_equal(out, exact)
    for a, c in zip(arrays, copies):
        np.testing.assert_array_equal(a, c)         # inputs untouched


@settings(max_examples=100, deadline=None, derandomize=True)
@given(layouts())
def test_message_log_is_consistent(case):
    per_node, op, arrays = case
    result = hierarchical_allreduce(arrays, per_node, op)
    for s in result.steps:
        assert 0 <= s.sender < result.world_size and 0 <= s.receiver < result.world_size and s.sender != s.receiver
    assert result.bytes_sent.sum() == sum(s.nbytes for s in result.steps)
    per_step = {}
    for s in result.steps:                           # one message out and one in per worker per step
        per_step.setdefault(s.step, []).append(s)
    for msgs in per_step.values():
        assert len({m.sender for m in msgs}) == len(msgs) and len({m.receiver for m in msgs}) == len(msgs)


def test_less_crosses_the_slow_link_than_the_flat_ring():
    arrays = [np.ones(1024, np.float32) * r for r in range(8)]       # 2 nodes x 4 ranks, 4 KiB each
    flat = inter_node_bytes(allreduce(arrays, "ring"), 4)
    two_level = inter_node_bytes(hierarchical_allreduce(arrays, 4), 4)
    # ring: one rank per node sends 2(R-1)/R * n = 1.75 * 4096; the leaders' 2-ring sends 2(2-1)/2 * n = n
    np.testing.assert_array_equal(flat, [7168, 7168])
    np.testing.assert_array_equal(two_level, [4096, 4096])


def test_two_tier_model_by_hand():
    intra, inter = Link(1e-5, 1e-9), Link(1e-4, 4e-8)
    n = 4 * 2**20
    got = predicted_times_s(2, 2, n, intra, inter)
    flat = 6 * (1e-4 + n / 4 * 4e-8)                             # 2(R-1) steps, each bottlenecked across nodes
    two_level = 2 * (1e-5 + n * 1e-9) + 2 * (1e-4 + n / 2 * 4e-8)  # reduce + broadcast inside, 2-ring across
    assert got["flat"] == pytest.approx(flat) and got["hierarchical"] == pytest.approx(two_level)
    assert got["hierarchical"] < got["flat"]
    equal = predicted_times_s(2, 2, n, intra, Link(1e-5, 1e-9))       # one fast tier: the extra steps cost
    assert equal["hierarchical"] > equal["flat"]


def test_one_node_is_a_plain_reduce_broadcast_and_bad_layouts_are_refused():
    result = hierarchical_allreduce([np.arange(3)] * 3, 3)
    assert {s.phase for s in result.steps} == {"reduce", "broadcast"}
    assert two_tier_time_s(result, 3, Link(1.0, 0.0), Link(100.0, 0.0)) == 4.0
    with pytest.raises(ValueError, match="do not split into nodes"):
        hierarchical_allreduce([np.arange(3)] * 5, 2)
    with pytest.raises(ValueError, match="op must be one of"):
        hierarchical_allreduce([np.arange(3)] * 2, 1, "prod")
    with pytest.raises(ValueError, match="must be >= 0"):
        Link(-1.0, 0.0)


@pytest.mark.parametrize("nodes,per_node", [(1, 1), (1, 4), (2, 1), (2, 2), (3, 4), (4, 2), (8, 8)])
@pytest.mark.parametrize("algorithm", ["flat", "hierarchical"])
def test_closed_form_equals_the_simulators_message_log(nodes, per_node, algorithm):
    """The explorer's closed form (no arrays, so 25 M parameters on 64 ranks cost nothing) is the simulator's time."""
    intra, inter = Link(2e-6, 1e-10), Link(3e-5, 8e-9)
    world = nodes * per_node
    arrays = [np.zeros(world * nodes * 16, np.float32) for _ in range(world)]    # chunks divide evenly
    simulated = (allreduce(arrays, "ring") if algorithm == "flat" else hierarchical_allreduce(arrays, per_node))
    expected = two_tier_time_s(simulated, per_node, intra, inter)
    got = two_tier_cost_s(algorithm, world, per_node, arrays[0].nbytes, intra, inter)
    assert got == pytest.approx(expected, rel=1e-12)


def test_closed_form_partial_node_and_bad_input():
    intra, inter = Link(0.0, 1.0), Link(0.0, 10.0)
    # 5 ranks on nodes of 4: two nodes; two-level: 3 reduce + 3 broadcast steps of n inside, 2 ring steps of n/2 across
    assert two_tier_cost_s("hierarchical", 5, 4, 8.0, intra, inter) == pytest.approx(6 * 8 + 2 * 10 * 4)
    assert two_tier_cost_s("flat", 5, 4, 10.0, intra, inter) == pytest.approx(8 * 10 * 2)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        two_tier_cost_s("ring", 4, 2, 8.0, intra, inter)
    with pytest.raises(ValueError, match="nbytes"):
        two_tier_cost_s("flat", 4, 2, -1.0, intra, inter)


@pytest.mark.parametrize("alpha_s, beta", [(0.0, float("inf")), (float("nan"), 1e-9), (0.0, -1e-9)])
def test_a_link_is_finite_and_non_negative(alpha_s, beta):
    """A near-zero rate makes beta infinite, and the planner printed 'nan s' from it (issue 53)."""
    from labkit.comm.two_tier import Link

    with pytest.raises(ValueError, match="must be >= 0 and finite"):
        Link(alpha_s, beta)
    assert Link(0.0, 1 / 25e9).time_s(25e9) == pytest.approx(1.0)
