"""The simulator's check: within the rounding bound of each algorithm's summation depth, identical on every rank."""
import numpy as np
import pytest

from labkit.comm.collectives import ALGORITHMS, allreduce
from labkit.comm.exactness import (AllreduceMismatch, check_allreduce, error_bound, summation_depth,
                                   unit_roundoff)


def arrays(world_size: int, dtype: str, n: int = 4096, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(dtype) for _ in range(world_size)]


def test_depths_follow_the_summation_order():
    assert [summation_depth(a, 8) for a in ("naive", "ring", "tree", "halving_doubling")] == [7, 7, 3, 3]
    assert summation_depth("two_tier_not_known_here", 8) == 7     # R - 1 bounds every order of R terms
    assert unit_roundoff("float16") == 2.0**-11 and unit_roundoff("float32") == 2.0**-24
    assert unit_roundoff("int32") == 0.0


@pytest.mark.parametrize("world_size", [8, 16, 32])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_half_precision_passes_within_its_bound_and_ranks_agree_bitwise(algorithm, world_size):
    xs = arrays(world_size, "float16")
    out = check_allreduce(xs, allreduce(xs, algorithm).outputs, algorithm, "sum")
    assert out["ranks_identical"] and 0 < out["max_abs_error"] <= out["max_error_bound"]


def test_the_bound_is_tight_enough_to_catch_a_real_error():
    xs = arrays(8, "float32")
    outs = allreduce(xs, "ring").outputs
    wrong = [o + np.float32(1e-2) for o in outs]                  # the same wrong answer on every rank
    with pytest.raises(AllreduceMismatch, match="more than the rounding bound"):
        check_allreduce(xs, wrong, "ring", "sum")


def test_ranks_that_differ_by_one_ulp_are_caught_apart_from_the_bound():
    xs = arrays(4, "float32")
    outs = [o.copy() for o in allreduce(xs, "tree").outputs]
    outs[2][7] = np.nextafter(outs[2][7], np.float32(np.inf))     # well within the bound, but not identical
    with pytest.raises(AllreduceMismatch, match=r"ranks \[2\] hold different bits"):
        check_allreduce(xs, outs, "tree", "sum")


def test_integers_and_max_are_exact():
    xs = [np.arange(10, dtype="int32") * (r + 1) for r in range(5)]
    assert not error_bound(xs, "ring", "sum").any() and not error_bound(arrays(4, "float32"), "ring", "max").any()
    assert check_allreduce(xs, allreduce(xs, "ring").outputs, "ring", "sum")["max_abs_error"] == 0
