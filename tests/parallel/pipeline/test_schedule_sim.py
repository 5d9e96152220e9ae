"""The schedule maths of labkit.parallel.pipeline.schedule_sim: both bubble normalisations, the formulas, the replay, the
orders, checked against hand-worked schedules and the kit's GPipe simulator."""
from dataclasses import replace
from types import SimpleNamespace

import pytest

from labkit.parallel.pipeline import schedule_sim as sim
from labkit.parallel.pipeline.gpipe import simulate_gpipe
from labkit.parallel.pipeline.schedule_sim import micro_batches_for_bubble, predicted_bubble


def order_spans(orders: dict[int, list[str]], stage_of_rank=None, times=None) -> list[sim.Span]:
    """Spans in the given per-rank orders, back to back from t = 0 (the replay fixes the real start times)."""
    times = times or sim.IDEAL_TIMES
    spans = []
    for rank, order in orders.items():
        t = 0.0
        for action in order:
            kind, mb = action[0], int(action[1:])
            stage = stage_of_rank(rank, mb) if stage_of_rank else rank
            spans.append(sim.Span(rank, stage, kind, mb, t, t + times[kind]))
            t += times[kind]
    return spans


def test_the_bubble_formula_by_hand_and_the_micro_batches_a_target_needs():
    assert predicted_bubble(2, 1) == 0.5 and predicted_bubble(4, 8) == 3 / 11 and predicted_bubble(1, 5) == 0.0
    assert micro_batches_for_bubble(2, 0.2) == 4            # 1/(4+1) = 0.2
    assert micro_batches_for_bubble(4, 0.1) == 27           # 3/(27+3) = 0.1
    with pytest.raises(ValueError):
        micro_batches_for_bubble(2, 1.0)
    with pytest.raises(ValueError, match=r"^micro_batches must be an integer >= 1, got 0$"):
        predicted_bubble(2, 0)


def test_gpipe_replayed_ideally_has_the_published_bubble_in_both_normalisations():
    p, m = 4, 8
    spans = sim.replay(order_spans({r: sim.gpipe_order(m) for r in range(p)}))
    assert sim.bubble_of_ideal(spans, p) == pytest.approx((p - 1) / m)
    assert sim.bubble_of_total(spans, p) == pytest.approx(predicted_bubble(p, m))
    assert sim.ideal_to_total(sim.bubble_of_ideal(spans, p)) == pytest.approx(sim.bubble_of_total(spans, p))


def test_the_replay_of_gpipe_matches_the_kits_gpipe_simulator():
    p, m, f, b = 3, 5, 1.0, 2.5
    spans = sim.replay(order_spans({r: sim.gpipe_order(m) for r in range(p)}, times={"F": f, "B": b}))
    reference = simulate_gpipe([f] * p, [b] * p, m)
    assert sim.makespan_s(spans) == pytest.approx(max(e.end_s for e in reference))


def test_1f1b_has_gpipes_bubble_and_holds_p_minus_s_micro_batches():
    p, m = 4, 8
    spans = sim.replay(order_spans({r: sim.one_f_one_b_order(p, r, m) for r in range(p)}))
    assert sim.bubble_of_total(spans, p) == pytest.approx(predicted_bubble(p, m))
    assert [sim.peak_in_flight(sim.one_f_one_b_order(p, s, m)) for s in range(p)] == [4, 3, 2, 1]
    assert sim.peak_in_flight(sim.gpipe_order(m)) == m


def test_1f1b_order_by_hand():
    assert sim.one_f_one_b_order(2, 0, 4) == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert sim.one_f_one_b_order(2, 1, 3) == ["F0", "B0", "F1", "B1", "F2", "B2"]
    assert sim.one_f_one_b_order(4, 0, 2) == ["F0", "F1", "B0", "B1"]
    with pytest.raises(ValueError, match="stage must be in 0..1"):
        sim.one_f_one_b_order(2, 2, 4)


def test_gaps_and_hops_lengthen_the_replay_by_hand():
    spans = order_spans({0: ["F0", "B0"], 1: ["F0", "B0"]}, times={"F": 1.0, "B": 1.0})
    assert sim.makespan_s(sim.replay(spans)) == pytest.approx(4.0)                 # F0 F0 B0 B0 in a chain
    assert sim.makespan_s(sim.replay(spans, hop_s=0.5)) == pytest.approx(5.0)      # two cross-rank hops
    # rank 1's B0 follows its own F0 (the gap counts); rank 0's B0 waits on rank 1 (the wait hides its gap)
    assert sim.makespan_s(sim.replay(spans, gap_s=0.25)) == pytest.approx(4.25)


def test_measured_gaps_recovers_a_known_hop_and_gap():
    spans = sim.replay(order_spans({0: sim.gpipe_order(4), 1: sim.gpipe_order(4)}), hop_s=0.3, gap_s=0.1)
    hop, gap = sim.measured_gaps(spans)
    assert hop == pytest.approx(0.3) and gap == pytest.approx(0.1)
    assert sim.makespan_s(sim.replay(spans, hop, gap)) == pytest.approx(sim.makespan_s(spans))


def test_an_impossible_order_is_one_clear_error():
    spans = order_spans({0: ["B0", "F0"], 1: ["F0", "B0"]})
    with pytest.raises(ValueError, match="cannot run"):
        sim.replay(spans)


def test_zero_bubble_weight_grads_wait_for_their_input_grads():
    spans = order_spans({0: ["F0", "I0", "W0"]}, stage_of_rank=lambda r, mb: 0)
    out = {s.kind: s for s in sim.replay(spans)}
    assert out["W"].start_s >= out["I"].end_s and out["I"].start_s >= out["F"].end_s


def test_ideally_timed_keeps_the_order_and_sets_the_times():
    spans = [replace(s, end_s=s.start_s + 7.0) for s in order_spans({0: sim.gpipe_order(2), 1: sim.gpipe_order(2)})]
    ideal = sim.ideally_timed(spans)
    assert {s.kind: s.duration_s for s in ideal} == {"F": 1.0, "B": 2.0}


def test_formulas_and_where_none_is_quoted():
    assert sim.formula_bubble_of_ideal("ScheduleGPipe", 1, 4, 8) == pytest.approx(3 / 8)
    assert sim.formula_bubble_of_ideal("ScheduleInterleaved1F1B", 2, 4, 8) == pytest.approx(3 / 16)
    assert sim.formula_bubble_of_ideal("ScheduleInterleavedZeroBubble", 1, 4, 8) == pytest.approx(1 / 8)
    assert sim.formula_bubble_of_ideal("ScheduleDualPipeV", 2, 4, 8) is None


def test_hops_and_span_validation():
    assert sim.cross_rank_hops([0, 1, 0, 1]) == 3 and sim.cross_rank_hops([0, 1, 1, 0]) == 2
    with pytest.raises(ValueError, match="kind must be one of"):
        sim.Span(0, 0, "X", 0, 0.0, 1.0)
    assert sim.Span(0, 1, "W", 3, 1.0, 1.5).label == "W3"


def test_a_deferred_send_delays_its_consumer_in_the_replay():
    """DualPipeV-style: rank 0 posts F0's send only after its next action, so rank 1 waits for that one too."""
    spans = [sim.Span(0, 0, "F", 0, 0.0, 1.0), sim.Span(0, 0, "F", 1, 1.0, 3.0), sim.Span(1, 1, "F", 0, 3.0, 4.0)]
    deferred = [SimpleNamespace(rank=0, stage=0, what="send F", micro_batch=0, time_s=3.0)]
    assert sim.send_carriers(spans, deferred) == {(0, "F", 0): (0, "F", 1)}
    assert sim.makespan_s(sim.replay(spans)) == pytest.approx(3.0)               # F0 of stage 1 right after 1.0
    assert sim.makespan_s(sim.replay(spans, posts=deferred)) == pytest.approx(4.0)
    assert sim.measured_gaps(spans, deferred)[0] == pytest.approx(0.0)           # the wait was the deferral
    assert sim.measured_gaps(spans)[0] == pytest.approx(2.0)                    # without posts: a 2 s "hop"
