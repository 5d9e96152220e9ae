"""The verdict protocol, decided with stand-in CPU shares and spreads: a wrong model fails, busy or quiet."""
import pytest

from labkit.core.verdict import (CHECKED, FAILED, INCONCLUSIVE, LOAD, QUIET, Load, Rival, judge_agreement,
                                 judge_at_least, judge_at_most, median_bounds, relative_spread)

BUSY = Load({"rank 0": 0.46, "rank 1": 0.93}, spread=0.1)   # one rank shared its core with a spinning neighbour
NOISY = Load({"kernel": 0.97}, spread=0.6)


def test_a_claim_that_holds_is_checked_busy_or_quiet():
    for load in (QUIET, BUSY):
        v = judge_agreement("the model says it pays", predicted=1.65, measured=1.5, tolerance=0.25, load=load)
        assert v.state == CHECKED and v.holds
    assert judge_at_least("batch 64 beats 8", 2.0, 1.3, load=BUSY).state == CHECKED
    assert judge_at_most("overhead under 10%", 1.05, 1.1, load=BUSY).state == CHECKED


def test_busy_machine_that_explains_the_gap_is_inconclusive_with_the_measured_reason():
    v = judge_agreement("the model says it pays", predicted=1.65, measured=0.84, tolerance=0.25, load=BUSY)
    assert v.state == INCONCLUSIVE and not v.holds
    assert "rank 0 got 0.46 of a core" in v.detail and "rank 1" not in v.detail
    assert "close other programs and rerun this cell" in v.detail and "predicted 1.65x, measured 0.84x" in v.detail
    assert judge_at_least("batch 64 beats 8", 1.1, 1.3, load=NOISY).state == INCONCLUSIVE
    assert "rounds spread 60%" in judge_at_least("c", 1.1, 1.3, load=NOISY).detail


def test_same_gap_on_a_quiet_machine_fails():
    v = judge_agreement("the model says it pays", predicted=1.65, measured=0.84, tolerance=0.25, load=QUIET)
    assert v.state == FAILED and "on a quiet machine" in v.detail
    measured_quiet = Load({"rank 0": 0.97, "rank 1": 0.99}, spread=0.05)
    assert judge_at_least("c", 1.1, 1.3, load=measured_quiet).state == FAILED
    assert judge_at_most("c", 1.3, 1.1, load=measured_quiet).state == FAILED


def test_a_deliberately_wrong_model_fails_under_load_too():
    """Predicting 4x where the clock reads 0.84x is more than half a core can explain: fail, never INCONCLUSIVE."""
    v = judge_agreement("a wrong model", predicted=4.0, measured=0.84, tolerance=0.25, load=BUSY)
    assert v.state == FAILED and "larger than this run's load can explain" in v.detail
    # Even on a very busy machine, a claim off by far more than the starvation is a failure.
    very_busy = Load({"rank 0": 0.3}, spread=0.3)
    assert judge_at_least("a wrong threshold", 1.0, 10.0, load=very_busy).state == FAILED
    assert judge_at_least("a plausible one", 1.0, 3.0, load=very_busy).state == INCONCLUSIVE


def test_a_band_that_holds_its_rival_is_undecided_on_a_busy_run_and_a_failure_on_a_quiet_one():
    """05's bubble at m=2 under load (CI, a core kept busy): (p-1)/(m+p-1) = 0.333 predicted, 0.402 measured, a band
    of 26.6 % from the rounds' spread that also holds the rival (p-1)/m = 0.5. The load moved the measurement."""
    args = dict(predicted=1 / 3, measured=0.402, tolerance=0.266, unit="", rival=Rival("(p-1)/m", 0.5))
    busy = judge_agreement("the bubble follows (p-1)/(m+p-1)", load=BUSY, **args)
    assert busy.state == INCONCLUSIVE and busy.kind == LOAD and "cannot tell" in busy.detail, busy
    assert "rank 0 got 0.46 of a core" in busy.detail and busy.rival == "(p-1)/m"
    quiet = judge_agreement("the bubble follows (p-1)/(m+p-1)", load=QUIET, **args)
    assert quiet.state == FAILED and "cannot tell" in quiet.detail
    # a band that holds the rival around the prediction itself fails, busy or not: no measurement could tell
    by_design = judge_agreement("c", predicted=0.4, measured=0.45, tolerance=0.3, unit="", rival=Rival("r", 0.5),
                                load=BUSY)
    assert by_design.state == FAILED and "cannot tell" in by_design.detail
    # a measurement further from the prediction than the load explains still fails, busy or not
    far = judge_agreement("c", predicted=0.1, measured=0.5, tolerance=0.2, unit="", rival=Rival("r", 0.55),
                          load=Load({"rank 0": 0.8}))
    assert far.state == FAILED and "cannot tell" in far.detail


def test_load_validation_and_spread():
    with pytest.raises(ValueError, match="shares"):
        Load({"rank 0": 1.7})
    with pytest.raises(ValueError, match="shares"):
        Load({"rank 0": 0.0})
    with pytest.raises(ValueError, match="spread"):
        Load({}, spread=-1)
    with pytest.raises(ValueError, match="predicted > 0"):
        judge_agreement("c", 0.0, 1.0, tolerance=0.1)
    assert relative_spread([1.0]) == 0.0
    assert relative_spread([1.0, 1.0, 1.0]) == 0.0
    assert relative_spread([0.5, 1.0, 1.5]) == pytest.approx(0.8)
    assert QUIET.worst_share == 1.0 and not QUIET.busy and QUIET.explainable_factor == 1.0


def test_another_process_on_the_gpu_makes_a_near_miss_inconclusive_naming_it_but_not_a_wrong_model():
    """Issue 43: a timing verdict made beside another GPU process is INCONCLUSIVE with that reason, as the CPU
    verdicts are; a gap far beyond one more time slice still fails."""
    shared = Load({"this kernel": 1.0}, gpu_neighbours={"pid 4242 on GPU 0 (3.0 GiB)": 0.6})
    assert shared.busy and shared.explainable_factor == pytest.approx(1.6)
    near = judge_at_least("fusion is at least 1.5x faster", 1.2, 1.5, load=shared)
    assert near.state == INCONCLUSIVE and "pid 4242 on GPU 0 (3.0 GiB) kept 60% of the SMs busy" in near.detail
    assert judge_at_least("fusion is at least 1.5x faster", 1.2, 1.5).state == FAILED        # alone: it fails
    assert judge_at_least("fusion is at least 1.5x faster", 0.5, 1.5, load=shared).state == FAILED


def test_load_from_meters_takes_each_meters_share_and_every_neighbour_once():
    class Meter:
        def __init__(self, share, neighbours):
            self.share, self.gpu_neighbours = share, neighbours

    load = Load.from_meters({"roofs": Meter(0.9, {"pid 1": 0.2}), "ops": Meter(0.5, {"pid 1": 0.4, "pid 2": 0.1})},
                            spread=0.1)
    assert dict(load.shares) == {"roofs": 0.9, "ops": 0.5} and load.spread == 0.1
    assert dict(load.gpu_neighbours) == {"pid 1": 0.4, "pid 2": 0.1}


def test_median_bounds_are_the_order_statistics_a_binomial_tail_allows():
    assert median_bounds(range(1, 10)) == (2, 8)            # 9 rounds: 2nd and 8th (coverage 96%)
    assert median_bounds(range(1, 21)) == (6, 15)           # 20 rounds: 6th and 15th (coverage 95.9%)
    assert median_bounds([3.0, 1.0, 2.0]) == (1.0, 3.0)     # too few rounds for 95%: the extremes
    assert median_bounds([2.0, float("nan")]) == (2.0, 2.0)
    with pytest.raises(ValueError, match="at least one finite value"):
        median_bounds([float("nan")])


def test_a_miss_whose_paired_rounds_straddle_the_bound_is_inconclusive_on_a_quiet_machine():
    # CI's notebook 11 run: median 0.481 against 0.475, rounds on both sides of the bound
    rounds = [(0.38, 0.48), (0.52, 0.46), (0.49, 0.47), (0.61, 0.48), (0.44, 0.49), (0.50, 0.47), (0.47, 0.48),
              (0.55, 0.46), (0.42, 0.48)]
    v = judge_at_most("checkpointing costs at most 1.5 forwards", 0.481, 0.475, load=QUIET, by_round=rounds)
    assert v.state == INCONCLUSIVE and "9 paired rounds do not settle it" in v.detail
    assert "rerun this cell" in v.detail
    # the same median miss with every round beyond the bound is a real miss: it fails on a quiet machine
    steady = [(0.481, 0.475)] * 9
    assert judge_at_most("c", 0.481, 0.475, load=QUIET, by_round=steady).state == FAILED
    # a wrong model fails even when one round dips inside the band
    wrong = [(0.9, 0.475)] * 8 + [(0.4, 0.475)]
    assert judge_at_most("c", 0.9, 0.475, load=QUIET, by_round=wrong).state == FAILED


def test_at_least_with_rounds_reads_each_rounds_shortfall():
    rounds = [(1.2, 1.3), (1.5, 1.3), (1.25, 1.3), (1.4, 1.3), (1.1, 1.3), (1.35, 1.3)]
    assert judge_at_least("2 workers beat 1", 1.28, 1.3, by_round=rounds).state == INCONCLUSIVE
    assert judge_at_least("2 workers beat 1", 1.1, 1.3, by_round=[(1.1, 1.3)] * 6).state == FAILED
    assert judge_at_least("2 workers beat 1", 1.4, 1.3, by_round=[(1.1, 1.3)] * 6).state == CHECKED  # median decides
    with pytest.raises(ValueError, match="judge_at_least.s by_round needs pairs of two positive numbers"):
        judge_at_least("c", 1.1, 1.3, by_round=[(0.0, 1.3)])


def test_a_load_from_measured_shares_keeps_each_share_in_range():
    load = Load.measured({"rank 0": 1.02, "rank 1": 0.0, "rank 2": 0.5}, spread=0.1)
    assert load.shares == {"rank 0": 1.0, "rank 1": 1e-3, "rank 2": 0.5} and load.spread == 0.1
    ranks = Load.of_ranks([{"rank": 0, "cpu_share": 0.46}, {"rank": 1, "cpu_share": 1.3}], spread=0.2)
    assert ranks.shares == {"rank 0": 0.46, "rank 1": 1.0} and ranks.worst_share == 0.46 and ranks.busy
    with pytest.raises(ValueError, match="spread must be a number >= 0"):
        Load.measured({"rank 0": 0.9}, spread=-1.0)


def test_agreement_reads_each_round_on_the_side_the_median_missed():
    straddling = [(1.0, m) for m in (1.1, 1.5, 1.2, 1.45, 1.3, 1.4, 1.5, 1.35, 1.25)]      # median 1.35 vs band ±25%
    v = judge_agreement("copy and triad agree", 1.0, 1.35, tolerance=0.25, by_round=straddling)
    assert v.state == INCONCLUSIVE and "9 paired rounds do not settle it" in v.detail
    assert judge_agreement("c", 1.0, 1.35, tolerance=0.25, by_round=[(1.0, 1.35)] * 9).state == FAILED
    low = [(1.0, m) for m in (0.5, 0.52, 0.55, 0.5, 0.9, 0.51, 0.53, 0.5, 0.54)]           # too slow, all but one
    assert judge_agreement("c", 1.0, 0.52, tolerance=0.25, by_round=low).state == FAILED
    assert judge_agreement("c", 1.0, 1.1, tolerance=0.25, by_round=[(1.0, 3.0)] * 9).state == CHECKED  # median decides
    with pytest.raises(ValueError, match="judge_agreement's by_round needs pairs of two positive numbers"):
        judge_agreement("c", 1.0, 1.1, tolerance=0.25, by_round=[(1.0, -1.0)])
