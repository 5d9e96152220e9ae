"""The critical-batch verdicts: checked, failed and INCONCLUSIVE each reachable, with the numbers in the reason."""
from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE, Load
from labkit.training.critical_claims import (doubling_ratios, doubling_verdicts, estimates_agree,
                                             noise_grows, noise_scale_agrees, throughput_peak_loses)
from labkit.training.noise_scale import NoiseScale
from labkit.training.to_target import CriticalBatchFit


def _fit(b_crit=40.0, low=35.0, high=45.0, batches=(2, 4, 8, 16, 32, 64, 128, 256, 512)):
    s_min = 20.0
    return CriticalBatchFit(s_min, s_min * b_crit, b_crit, low, high, {b: s_min * (1 + b_crit / b) for b in batches}, 3)


def _ns(b, err, pairs=20):
    return NoiseScale(b, err, 1.0, b, pairs, 8, 256)


def test_agreement_checked_failed_inconclusive():
    assert noise_scale_agrees(_fit(), _ns(30, 5)).state == CHECKED
    assert noise_scale_agrees(_fit(), _ns(4000, 10)).state == FAILED
    wide = noise_scale_agrees(_fit(low=10, high=2000), _ns(30, 5))
    assert wide.state == INCONCLUSIVE and "more seeds" in wide.detail


def test_doubling_follows_the_model_below_and_above():
    below, above = doubling_verdicts(_fit())
    assert below.state == CHECKED and above.state == CHECKED
    assert doubling_ratios({8: 100, 16: 60, 64: 10})[8] == 0.6


def test_doubling_fails_on_flat_steps_and_is_inconclusive_without_pairs():
    flat = _fit()
    flat = CriticalBatchFit(flat.s_min, flat.e_min, 40, 35, 45, {2: 100, 4: 95, 8: 90, 256: 20, 512: 20}, 3)
    assert doubling_verdicts(flat)[0].state == FAILED
    narrow = _fit(batches=(16, 32, 64))
    below, above = doubling_verdicts(narrow)
    assert below.state == "NOT CHECKED" and above.state == "NOT CHECKED" and "fewer than two" in below.detail


def test_doubling_is_inconclusive_when_the_seeds_straddle_the_line():
    base = _fit(batches=(2, 4, 8, 16))
    noisy = CriticalBatchFit(base.s_min, base.e_min, 40, 35, 45, {2: 100.0, 16: 100.0 * 0.7 ** 3}, 3,
                             {2: 20.0, 16: 10.0})
    below, _ = doubling_verdicts(noisy)
    assert below.state == INCONCLUSIVE and below.kind == "spread" and "straddles" in below.detail


def test_growth_and_agreement_of_estimates():
    assert noise_grows(_ns(20, 3), _ns(80, 10)).state == CHECKED
    assert noise_grows(_ns(80, 3), _ns(20, 3)).state == FAILED
    assert noise_grows(_ns(20, 10), _ns(30, 10)).kind == "statistics"
    assert estimates_agree(_ns(30, 5), _ns(35, 5)).state == CHECKED
    assert estimates_agree(_ns(30, 1), _ns(60, 1)).state == FAILED
    wide = estimates_agree(_ns(30, 20), _ns(35, 20))        # issue 51: 3 standard errors admit 'a factor of 2'
    assert wide.state == INCONCLUSIVE and wide.kind == "statistics" and "a factor of 2 apart" in wide.detail


def test_throughput_peak_loses_uses_the_load_and_needs_a_peak_above_b_crit():
    times = {16: 1.0, 64: 0.8, 256: 2.0}
    rates = {16: 100.0, 64: 300.0, 256: 900.0}
    assert throughput_peak_loses(times, rates, _fit(), Load()).state == CHECKED
    assert throughput_peak_loses({16: 1.0, 64: 0.8, 256: 0.82}, rates, _fit(), Load()).state == FAILED
    assert throughput_peak_loses({16: 1.0, 64: 0.8, 256: 0.82}, rates, _fit(), Load({"k": 0.3})).state == INCONCLUSIVE
    low_peak = throughput_peak_loses(times, {16: 100.0, 64: 50.0, 256: 10.0}, _fit(), Load())
    assert low_peak.state == "NOT CHECKED" and "not above" in low_peak.detail


def test_each_rival_when_true_is_not_passed():
    """Issue 51: feed each verdict a run where its rival is true; none of them may come out checked."""
    # 'a factor of 2 apart': B_simple twice B_crit with tight errors fails (the old factor-10 band passed it)
    twice = noise_scale_agrees(_fit(b_crit=40.0, low=39.0, high=41.0), _ns(90, 1))
    assert twice.state == FAILED and twice.rival == "a factor of 2 apart"
    assert noise_scale_agrees(_fit(), _ns(30, 5)).rival == "a factor of 2 apart"      # named when checked too
    # 'the noise scale stays put': no growth is never checked, and says what would settle it
    flat = noise_grows(_ns(40, 3), _ns(40, 3))
    assert flat.state == INCONCLUSIVE and flat.kind == "statistics" and "stays put" in flat.detail
    assert noise_grows(_ns(20, 3), _ns(80, 10)).rival.startswith("the noise scale stays put")
    # 'perfect scaling' above B_crit: 0.5x the steps per doubling fails the 'buys little' claim
    perfect = CriticalBatchFit(1.0, 10.0, 10.0, 8.0, 12.0, {b: 1000.0 / b for b in (2, 4, 32, 64, 128)}, 3)
    _, above = doubling_verdicts(perfect)
    assert above.state == FAILED and above.rival.startswith("perfect scaling")
    # 'the batch does not matter' below B_crit: 1.0x per doubling fails the 'nearly halves' claim
    still = CriticalBatchFit(1.0, 10.0, 1000.0, 900.0, 1100.0, {b: 50.0 for b in (2, 4, 8, 16)}, 3)
    below, _ = doubling_verdicts(still)
    assert below.state == FAILED and below.rival.startswith("the batch does not matter")
    # 'the highest-throughput batch is the fastest': equal times fail on a quiet machine
    same = throughput_peak_loses({16: 1.0, 64: 0.8, 256: 0.8}, {16: 100.0, 64: 300.0, 256: 900.0}, _fit(), Load())
    assert same.state == FAILED and same.rival == "the highest-throughput batch is the fastest to the target"
