"""Simulated all-reduce: exact answers for any R, length and op; the ring's 2(R-1)/R; time = cost formula."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.comm.collectives import (ALGORITHMS, OPS, AllreduceResult, allreduce, allreduce_cost, chunk_sizes,
                                reference_allreduce)


def _world_sizes_for(algorithm: str) -> st.SearchStrategy[int]:
    if algorithm == "halving_doubling":
        return st.sampled_from([1, 2, 4, 8, 16])
    return st.integers(1, 13)


@st.composite
def cases(draw, dtype=np.int64):
    algorithm = draw(st.sampled_from(ALGORITHMS))
    world_size = draw(_world_sizes_for(algorithm))
    length = draw(st.integers(0, 40))
    op = draw(st.sampled_from(OPS))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-1000, 1000, size=length).astype(dtype) for _ in range(world_size)]
    return algorithm, op, arrays


@settings(max_examples=300, deadline=None, derandomize=True)
@given(cases())
def test_every_worker_gets_the_exact_reduction_integers(case):
    algorithm, op, arrays = case
    result = allreduce(arrays, algorithm, op)
    exact = reference_allreduce(arrays, op)
    assert len(result.outputs) == len(arrays)
    for out in result.outputs:
        assert out.shape == arrays[0].shape
        np.testing.assert_array_equal(out, exact)  # integers: no rounding, so exact equality


@settings(max_examples=150, deadline=None, derandomize=True)
@given(cases(dtype=np.float64))
def test_every_worker_gets_the_reduction_floats(case):
    algorithm, op, arrays = case
    result = allreduce(arrays, algorithm, op)
    exact = reference_allreduce(arrays, op)
    for out in result.outputs:
        np.testing.assert_allclose(out, exact, rtol=1e-12, atol=1e-9)
    for out in result.outputs[1:]:  # all workers hold bit-identical results (they copy the same reduced chunks)
        np.testing.assert_array_equal(out, result.outputs[0])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(cases())
def test_message_log_is_consistent(case):
    algorithm, op, arrays = case
    result = allreduce(arrays, algorithm, op)
    R = len(arrays)
    assert result.world_size == R
    by_step: dict[int, list] = {}
    for s in result.steps:
        assert 0 <= s.sender < R and 0 <= s.receiver < R and s.sender != s.receiver
        by_step.setdefault(s.step, []).append(s)
    for msgs in by_step.values():  # one-port model: at most one send and one receive per worker per step
        assert len({m.sender for m in msgs}) == len(msgs) and len({m.receiver for m in msgs}) == len(msgs)
    sent = np.zeros(R, dtype=np.int64)
    for s in result.steps:
        sent[s.sender] += s.nbytes
    np.testing.assert_array_equal(result.bytes_sent, sent)
    alpha, beta = 1e-4, 1e-8
    assert result.simulated_time_s(alpha, beta) == pytest.approx(
        allreduce_cost(algorithm, R, result.nbytes, alpha, beta, itemsize=result.itemsize), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("algorithm,R", [("ring", r) for r in (2, 3, 4, 5, 8, 12)] +
                         [("halving_doubling", r) for r in (2, 4, 8, 16)])
def test_bandwidth_optimal_algorithms_send_2_r_minus_1_over_r_of_the_data(algorithm, R):
    arrays = [np.ones(R * 10, dtype=np.float32) for _ in range(R)]  # divisible length: the exact figure
    result = allreduce(arrays, algorithm)
    np.testing.assert_array_equal(result.bytes_sent, 2 * (R - 1) * arrays[0].nbytes // R)
    assert result.num_steps == (2 * (R - 1) if algorithm == "ring" else 2 * int(math.log2(R)))


def test_ring_step_count_and_non_divisible_lengths():
    R, n = 5, 23
    result = allreduce([np.arange(n, dtype=np.float32) * (i + 1) for i in range(R)], "ring")
    assert result.num_steps == 2 * (R - 1)
    assert len(result.steps) == 2 * (R - 1) * R
    itemsize = 4
    # each worker skips one chunk per phase; every worker sends close to 2(R-1)/R of the data
    assert np.all(np.abs(result.bytes_sent - 2 * (R - 1) / R * n * itemsize) <= 2 * itemsize)
    assert list(chunk_sizes(n, R)) == [len(c) for c in np.array_split(np.arange(n), R)]


def test_naive_root_is_the_bottleneck():
    R = 6
    result = allreduce([np.ones(8) for _ in range(R)], "naive")
    assert result.bytes_sent[0] == (R - 1) * 64 and all(result.bytes_sent[1:] == 64)


@pytest.mark.parametrize("R", [1, 2, 3, 4, 7, 8, 16])
def test_cost_formula_matches_closed_forms_and_simulation(R):
    n_elems, itemsize, alpha, beta = R * 1000, 4, 5e-6, 1e-9
    nbytes = n_elems * itemsize
    arrays = [np.ones(n_elems, dtype=np.float32) for _ in range(R)]
    log2 = math.ceil(math.log2(R)) if R > 1 else 0
    closed = {"naive": 2 * (R - 1) * (alpha + nbytes * beta), "tree": 2 * log2 * (alpha + nbytes * beta),
              "ring": 2 * (R - 1) * alpha + 2 * (R - 1) / R * nbytes * beta,
              "halving_doubling": 2 * log2 * alpha + 2 * (R - 1) / R * nbytes * beta}
    for algorithm in ALGORITHMS:
        if algorithm == "halving_doubling" and R & (R - 1):
            continue
        expected = closed[algorithm]
        assert allreduce_cost(algorithm, R, nbytes, alpha, beta) == pytest.approx(expected, rel=1e-12, abs=1e-18)
        assert allreduce(arrays, algorithm).simulated_time_s(alpha, beta) == pytest.approx(expected, rel=1e-12,
                                                                                         abs=1e-18)


def test_ring_beats_naive_for_large_messages_and_tree_wins_for_tiny_ones():
    R, alpha, beta = 16, 1e-5, 1e-9
    assert allreduce_cost("ring", R, 100_000_000, alpha, beta) < allreduce_cost("naive", R, 100_000_000, alpha, beta)
    assert allreduce_cost("tree", R, 8, alpha, beta) < allreduce_cost("ring", R, 8, alpha, beta)


def test_multidimensional_arrays_keep_their_shape():
    arrays = [np.full((3, 4), i, dtype=np.float32) for i in range(3)]
    result = allreduce(arrays, "ring", "mean")
    assert isinstance(result, AllreduceResult)
    assert result.outputs[0].shape == (3, 4)
    np.testing.assert_allclose(result.outputs[2], 1.0)


def test_mean_of_integers_is_float():
    result = allreduce([np.array([1, 2]), np.array([2, 2])], "tree", "mean")
    np.testing.assert_allclose(result.outputs[0], [1.5, 2.0])


def test_inputs_are_not_modified():
    arrays = [np.arange(5.0) for _ in range(3)]
    allreduce(arrays, "ring")
    np.testing.assert_array_equal(arrays[1], np.arange(5.0))


# ---- bad input
@pytest.mark.parametrize("arrays,algorithm,op,match", [
    ([], "ring", "sum", r"R >= 1"),
    ([np.ones(3), np.ones(4)], "ring", "sum", "worker 1 has"),
    ([np.ones(3), np.ones(3, dtype=np.float32)], "ring", "sum", "same shape and dtype"),
    ([np.ones(3)] * 2, "butterfly", "sum", "algorithm must be one of"),
    ([np.ones(3)] * 2, "ring", "prod", "op must be one of"),
    ([np.ones(3)] * 3, "halving_doubling", "sum", "power-of-two"),
    ([np.array(["a"])] * 2, "ring", "sum", "numeric"),
])
def test_bad_input_gets_a_clear_error(arrays, algorithm, op, match):
    with pytest.raises(ValueError, match=match):
        allreduce(arrays, algorithm, op)


@pytest.mark.parametrize("args,match", [(("ring", 0, 8, 1e-6, 1e-9), "world_size must be an integer >= 1, got 0"),
                                        (("ring", 2, -1, 1e-6, 1e-9), "nbytes"),
                                        (("ring", 2, 8, -1.0, 1e-9), "alpha"),
                                        (("halving_doubling", 6, 8, 1e-6, 1e-9), "power-of-two"),
                                        (("mesh", 2, 8, 1e-6, 1e-9), "algorithm")])
def test_cost_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        allreduce_cost(*args)
