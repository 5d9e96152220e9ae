"""The GPipe schedule: simulated against the formula, and measured on a real two-process pipeline."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.parallel.pipeline import gpipe as pl
from labkit.parallel.pipeline import model_parallel as mp
from labkit.parallel.pipeline import schedule_sim as sim
from labkit.parallel.pipeline.schedule_sim import Span, bubble_of_total


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 16), f=st.floats(0.1, 5.0), ratio=st.floats(0.5, 3.0))
def test_simulated_bubble_equals_gpipe_formula(p, m, f, ratio):
    spans = pl.simulate_gpipe([f] * p, [f * ratio] * p, m)
    assert len(spans) == 2 * p * m and all(isinstance(s, Span) and s.rank == s.stage for s in spans)
    assert bubble_of_total(spans, p) == pytest.approx(sim.predicted_bubble(p, m), abs=1e-9)


def test_simulated_gpipe_runs_backwards_in_reverse_after_every_forward_by_hand():
    spans = pl.simulate_gpipe([1.0, 1.0], [2.0, 2.0], 2)
    last = sorted((s for s in spans if s.rank == 1), key=lambda s: s.start_s)
    assert [(s.label, s.start_s, s.end_s) for s in last] == [("F0", 1.0, 2.0), ("F1", 2.0, 3.0), ("B1", 3.0, 5.0),
                                                             ("B0", 5.0, 7.0)]
    assert max(s.end_s for s in spans) == 9.0       # (m + p - 1) x (T_F + T_B) = 3 x 3


def test_unequal_stages_bubble_more_and_naive_split_idles():
    assert sim.predicted_bubble(2, 1) == 0.5                       # naive split: one of two stages idle
    balanced = bubble_of_total(pl.simulate_gpipe([1, 1], [2, 2], 4), 2)
    skewed = bubble_of_total(pl.simulate_gpipe([1, 3], [2, 6], 4), 2)
    assert skewed > balanced
    with pytest.raises(ValueError):
        sim.predicted_bubble(0, 1)
    with pytest.raises(ValueError):
        pl.simulate_gpipe([1.0], [1.0, 2.0], 2)


def test_real_two_process_pipeline_structure():
    cfg = mp.SplitConfig(in_features=32, hidden=32)
    points = pl.measure_pipeline((1, 2), batch=8, repeats=1, cfg=cfg, timeout_s=120)
    assert [p.micro_batches for p in points] == [1, 2]
    for p in points:
        assert 0.0 <= p.measured < 1.0 and 0.0 <= p.simulated < 1.0 and p.makespan_s > 0
        assert p.predicted == sim.predicted_bubble(2, p.micro_batches)


def test_pipeline_timing_noise():
    steady = pl.simulate_gpipe([1.0, 1.0], [2.0, 2.0], 4)
    assert pl.pipeline_timing_noise(steady) == pytest.approx(1.0)
    jittery = steady + [Span(0, 0, "F", 9, 0.0, 5.0)]
    assert pl.pipeline_timing_noise(jittery) > 1.5


def test_pipeline_cpu_share():
    evs = [Span(0, 0, "F", 0, 0.0, 2.0, 1.0), Span(1, 1, "F", 0, 2.0, 4.0, 2.0)]
    assert pl.pipeline_cpu_share(evs) == pytest.approx(0.75)


def test_micro_batches_must_divide_the_batch_before_anything_launches():
    assert pl.micro_batch_size(64, 8) == 8
    with pytest.raises(ValueError, match=r"^batch=8 must split evenly into 3 micro-batches"):
        pl.launch_pipeline((1, 3), batch=8)                    # raises here, no process is started
    with pytest.raises(ValueError, match=r"^each value in micro_batch_counts must be an integer >= 1, got 0$"):
        pl.launch_pipeline((0,), batch=8)
    with pytest.raises(ValueError, match=r"^micro_batches must be an integer >= 1, got 0$"):
        pl.simulate_gpipe([1.0], [1.0], 0)


# ---------------------------------------------------------------------------- the lessons' verdicts (issue 51)
def _repeats(m, jitter=(1.0, 1.06, 0.96, 1.03), delay=0.1, backward=2.0):
    """Simulated repeats of a GPipe step, each as if measured (cpu_s = duration): every action slowed by ``jitter`` in
    each repeat (noise), ``delay``: every message's hop, ``backward``: stage 1's backward time."""
    out = []
    for k in jitter:
        spans = pl.simulate_gpipe([k, k], [2 * k, backward * k], m)
        spans = [Span(s.rank, s.stage, s.kind, s.micro_batch, s.start_s, s.end_s, s.end_s - s.start_s) for s in spans]
        if delay:
            spans = sim.replay(spans, hop_s=delay)
        out.append(spans)
    return out


def test_least_disturbed_is_the_shortest_makespan():
    fast, slow = _repeats(2, jitter=(1.0, 1.5))
    assert pl.least_disturbed([slow, fast]) is fast
    with pytest.raises(ValueError, match="at least one repeat"):
        pl.least_disturbed([])


def test_bubble_formula_passes_when_true_and_rejects_its_rival():
    verdict = pl.judge_bubble_formula(_repeats(2))
    assert verdict.state == "checked" and verdict.rival == "(p-1)/m" and "rules out (p-1)/m = 0.5" in verdict.detail


def test_bubble_formula_fails_when_the_bubble_is_its_rival():
    """Two micro-batches that never overlap (stage 1 starts once stage 0 is done): the bubble is (p-1)/m = 0.5."""
    order = [(0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (1, "F", 0, 2, 3), (1, "F", 1, 3, 4), (1, "B", 1, 4, 6),
             (1, "B", 0, 6, 8), (0, "B", 1, 8, 10), (0, "B", 0, 10, 12)]
    rival_true = [[Span(r, r, k, i, a * f, b * f, (b - a) * f) for r, k, i, a, b in order] for f in (1.0, 1.01, 0.99)]
    assert pl.repeat_bubbles(rival_true)[0] == pytest.approx(0.5)
    assert pl.judge_bubble_formula(rival_true).state == "failed"


def test_bubble_formula_fails_when_slow_messages_push_it_to_the_rival():
    """Messages that wait as long as a forward: the band must widen to explain them, and then holds the rival."""
    verdict = pl.judge_bubble_formula(_repeats(2, delay=1.0))
    assert verdict.state == "failed" and "cannot tell" in verdict.detail


def test_naive_split_idles_half_and_micro_batches_shrink_it():
    naive, piped = _repeats(1), _repeats(4)
    assert pl.judge_naive_idles(naive).state == "checked"
    shrink = pl.judge_micro_batches_shrink(naive, piped)
    assert shrink.state == "checked" and shrink.rival.startswith("micro-batches change nothing")


def test_micro_batches_that_change_nothing_fail():
    naive = _repeats(1)
    assert pl.judge_micro_batches_shrink(naive, naive).state == "failed"


def test_a_naive_split_whose_stages_overlap_fails():
    """Rival true: both stages busy at once (bubble about 5%, as if they overlapped)."""
    overlapped = [[Span(r, r, "F", 0, 0.0, 1.0, 1.0) for r in (0, 1)]
                  + [Span(r, r, "B", 0, 1.1, 2.1, 1.0) for r in (0, 1)] for _ in range(4)]
    assert pl.judge_naive_idles(overlapped).state == "failed"


def test_message_share_is_what_the_hops_add():
    bare = _repeats(2, delay=0.0)[0]
    slow = _repeats(2, delay=0.5)[0]
    assert abs(pl.message_share(bare)) < 1e-9 and pl.message_share(slow) > 0.05
