"""Notebook 17's tables and verdicts on hand-made rank results: the prediction from the run's own fit and
backward, the slowest rank per round, and verdicts that reject the rival 'no overlap'."""
import math

import matplotlib

matplotlib.use("Agg")

from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE
from labkit.parallel.overlap import report

# one layer pair: "1" ends backward at 4 ms, "0" at 10 ms; alpha 0, beta 1e-6 s/B: 2000 B per layer -> 2 ms each
LAYERS = [("1", 0.0, 0.004), ("0", 0.004, 0.010)]


def _step(wait_s, step_s, buckets=()):
    return {"step_s": step_s, "backward_s": 0.010, "wait_s": wait_s, "layers": LAYERS, "buckets": list(buckets)}


def _rank(rank, wait, share=1.0, rounds=6):
    per_layer = [(0, 2000, 0.004, 0.006), (1, 2000, 0.010, 0.012)]
    one = [(0, 4000, 0.010, 0.014)]
    return {"rank": rank, "cpu_share": share, "fit": {"alpha_s": 0.0, "beta_s_per_byte": 1e-6},
            "bucket_layers": {"cap=0": [["1"], ["0"]], "cap=inf": [["1", "0"]]},
            "rounds": {"none": [_step(0.0, 0.020)] * rounds,
                       "naive": [_step(0.004, 0.024, one)] * rounds,
                       "cap=0": [_step(wait, 0.020 + wait, per_layer)] * rounds,
                       "cap=inf": [_step(0.004, 0.024, one)] * rounds}}


def test_the_prediction_uses_the_fit_and_the_backward_without_communication():
    pred = report.predicted_sweep([_rank(0, 0.002), _rank(1, 0.002)])
    # per layer: ready 4 and 10 ms, 2 ms each -> ends 6, 12 -> 2 ms exposed of 4; one bucket: 10 + 4 -> 4 exposed
    assert math.isclose(pred[0.0]["exposed_s"], 0.002) and math.isclose(pred[0.0]["comm_s"], 0.004)
    assert math.isclose(pred[math.inf]["exposed_s"], 0.004) and pred[math.inf]["buckets"] == 1
    assert math.isclose(pred[0.0]["overlappable_s"], 0.006)
    assert report.predicted_best_cap([_rank(0, 0.002), _rank(1, 0.002)]) == 0.0


def test_each_round_counts_its_slowest_rank_and_the_wait_of_the_last_one_out_of_backward():
    results = [_rank(0, 0.001), _rank(1, 0.003)]
    assert report.per_round(results, "cap=0", "wait_s") == [0.001] * 6       # rank 1 waited for rank 0's backward
    assert report.per_round(results, "cap=0", "step_s") == [0.023] * 6
    rows = report.sweep_rows(results)
    assert [r["bucket cap"] for r in rows] == ["one per parameter", "one bucket"]
    assert math.isclose(rows[0]["measured exposed ms"], 1.0) and math.isclose(rows[1]["predicted comm ms"], 4.0)
    assert report.measured_best_cap(results) == 0.0


def test_overlap_is_checked_when_the_wait_is_near_the_model_and_fails_at_the_rival():
    # model: 2 of 4 ms exposed -> hidden half -> bound 0.75 x T_comm (4 ms) = 3 ms
    ok = report.hidden_verdict([_rank(0, 0.002), _rank(1, 0.002)], 0.0, "overlap hides communication")
    assert ok.state == CHECKED, ok.detail
    assert ok.rival == report.RIVAL_NO_OVERLAP and "rules out" in ok.detail, ok.detail
    rival = report.hidden_verdict([_rank(0, 0.004), _rank(1, 0.004)], 0.0, "overlap hides communication")
    assert rival.state == FAILED, rival.detail


def test_a_model_that_predicts_no_hiding_cannot_tell_overlap_from_the_rival():
    # backward ends at 10 ms and one bucket is ready only then: the model hides nothing, its bound is T_comm itself
    verdict = report.hidden_verdict([_rank(0, 0.004), _rank(1, 0.004)], math.inf, "overlap hides communication")
    assert verdict.state == FAILED and "cannot tell" in verdict.detail, verdict.detail


def test_one_bucket_must_lose_by_half_the_predicted_margin():
    # predicted (20 + 4) / (20 + 2) = 1.09 -> threshold 1.045; measured 24 / 22 = 1.09 passes; equal steps fail
    ok = report.one_bucket_verdict([_rank(0, 0.002), _rank(1, 0.002)], 0.0, "one bucket loses")
    assert ok.state == CHECKED, ok.detail
    assert ok.rival == report.RIVAL_SIZE_DOES_NOT_MATTER and "rules out" in ok.detail, ok.detail
    same = report.one_bucket_verdict([_rank(0, 0.004), _rank(1, 0.004)], 0.0, "one bucket loses")
    assert same.state == FAILED, same.detail                      # the rival true: equal steps
    tie = report.one_bucket_verdict([_rank(0, 0.004), _rank(1, 0.004)], math.inf, "one bucket loses")
    assert tie.state == FAILED and "cannot tell" in tie.detail, tie.detail   # the model itself predicts 1.0x


def test_the_figures_draw_from_the_results():
    results = [_rank(0, 0.002), _rank(1, 0.002)]
    ax = report.plot_timeline(results[0], "cap=0")
    assert len(ax.patches) == 2 + 2            # two layers, two buckets
    ax = report.plot_sweep(report.sweep_rows(results))
    assert len(ax.lines) == 3


def test_a_starved_run_that_misses_says_inconclusive_with_the_measured_share():
    # the rival's numbers on ranks that got 0.3 of a core: a 1.33x miss is within what that load can explain
    starved = [_rank(0, 0.004, share=0.3), _rank(1, 0.004, share=0.3)]
    verdict = report.hidden_verdict(starved, 0.0, "overlap hides communication")
    assert verdict.state == INCONCLUSIVE and "0.30 of a core" in verdict.detail, verdict.detail
