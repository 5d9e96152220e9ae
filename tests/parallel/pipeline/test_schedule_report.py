"""labkit.parallel.pipeline.schedule_report on hand-built runs: the bubble row's columns, loads, messages, the trade-off."""
import pytest

from labkit.parallel.pipeline import schedule_report as report
from labkit.parallel.pipeline import schedule_sim as sim
from labkit.parallel.pipeline.schedules import ScheduleRun
from labkit.parallel.pipeline.schedule_trace import Post


def gpipe_run(m: int = 4, p: int = 2, schedule: str = "ScheduleGPipe", bytes_per_mb: int = 1000) -> ScheduleRun:
    """An ideally timed GPipe step on p ranks, as a live run would report it."""
    spans = []
    for r in range(p):
        t = 0.0
        for a in sim.gpipe_order(m):
            d = sim.IDEAL_TIMES[a[0]]
            spans.append(sim.Span(r, r, a[0], int(a[1:]), t, t + d, 0.5 * d))
            t += d
    spans = sim.replay(spans)
    return ScheduleRun(schedule, m, p, 1, {r: [r] for r in range(p)}, spans, {r: m * bytes_per_mb for r in range(p)},
                       2 * m * (p - 1), 2 * m * (p - 1) * 64, {r: 0.5 for r in range(p)}, 0.0, 0.0, 1.0)


def test_bubble_row_of_an_ideal_run_equals_the_formula_everywhere():
    row = report.bubble_row(gpipe_run(m=4, p=2))
    for column in ("ideally timed", "measured durations", "+ host gaps and hops", "live", "formula (of total)"):
        assert row[column] == pytest.approx(1 / 5), column
    assert row["live (of ideal)"] == pytest.approx(1 / 4) == row["formula (of ideal)"]
    assert row["replay makespan (ms)"] == pytest.approx(row["live makespan (ms)"])


def test_load_messages_memory_and_tradeoff():
    run = gpipe_run(m=4, p=2)
    load = report.run_load(run)
    assert load.worst_share == 0.5 and load.busy
    assert report.expected_messages(run) == run.messages == 8
    per_mb = report.bytes_per_micro_batch(run)
    assert per_mb == {0: 1000, 1: 1000}
    row = report.tradeoff_row(run, per_mb)
    assert row["= micro-batches held"] == 4 and row["bubble, live (%)"] == pytest.approx(20)
    assert row["schedule"] == "GPipe" and row["rule"] == report.RULES["ScheduleGPipe"]
    assert report.action_order(run, 1) == sim.gpipe_order(4)


def test_memory_per_micro_batch_needs_a_gpipe_run():
    with pytest.raises(ValueError, match="needs a ScheduleGPipe run"):
        report.bytes_per_micro_batch(gpipe_run(schedule="Schedule1F1B"))


def test_a_send_posted_before_its_forward_ended_is_caught():
    run = gpipe_run(m=2, p=2)
    f0 = next(s for s in run.spans if (s.rank, s.kind, s.micro_batch) == (0, "F", 0))
    on_time, early = Post(0, 0, "send F", 0, f0.end_s, 64), Post(0, 0, "send F", 0, f0.end_s - 0.5, 64)
    assert report.early_sends(ScheduleRun(**{**vars(run), "posts": [on_time]})) == []
    assert report.early_sends(ScheduleRun(**{**vars(run), "posts": [on_time, early]})) == [early]


def test_a_step_stretched_between_actions_shows_in_the_repeats_makespans():
    """Even forward times say nothing of a pause between actions; the spread of the repeated steps' makespans does."""
    steady = ScheduleRun(**{**vars(gpipe_run(m=4, p=2)), "cpu_shares": {0: 1.0, 1: 1.0},
                            "makespans_s": (10.0, 10.1, 10.0, 10.2)})
    assert report.run_load(steady).spread < 0.05 and not report.run_load(steady).busy
    paused = ScheduleRun(**{**vars(steady), "makespans_s": (10.0, 14.0, 10.1, 13.0)})
    assert report.run_load(paused).spread > 0.25 and report.run_load(paused).busy


def _with_gaps(run: ScheduleRun, hop_s: float, gap_s: float) -> ScheduleRun:
    """The same step as if every message took hop_s and every action waited gap_s of host time: two repeats."""
    spans = sim.replay(run.spans, hop_s, gap_s)
    late = [sim.Span(s.rank, s.stage, s.kind, s.micro_batch, s.start_s + 100, s.end_s + 100, s.cpu_s) for s in spans]
    return ScheduleRun(**{**vars(run), "spans": spans, "rounds": ((spans, []), (late, []))})


def test_replay_of_each_repeat_reproduces_its_live_makespan_and_rejects_the_bare_replay():
    run = _with_gaps(gpipe_run(m=4, p=2), hop_s=1.0, gap_s=0.5)
    rounds = report.replay_rounds(run)
    assert len(rounds) == 2 and all(live == pytest.approx(replayed) and replayed > bare for live, replayed, bare in rounds)
    verdict = report.judge_replay(run)
    assert verdict.state == "checked" and "rules out the replay of the action times alone" in verdict.detail


def test_replay_is_not_checked_where_the_host_adds_too_little_time_to_tell_the_rival_apart():
    """Rival true: no host gaps or hops at all, so the replay of the action times alone is the live makespan."""
    verdict = report.judge_replay(gpipe_run(m=4, p=2))
    assert verdict.state == "NOT CHECKED" and "added only 0%" in verdict.detail


def test_replay_claim_fails_when_the_replay_misses_the_gaps_it_was_given(monkeypatch):
    """A wrong model: gaps and hops measured at a tenth of their size. The run's gaps are large (the rival is far
    outside the band), so the replay's miss is a failure on a quiet machine, not a NOT CHECKED."""
    gapped = _with_gaps(gpipe_run(m=4, p=2), hop_s=1.0, gap_s=0.5)
    run = ScheduleRun(**{**vars(gapped), "cpu_shares": {0: 1.0, 1: 1.0}, "makespans_s": (10.0, 10.0)})   # quiet
    measured = report.measured_gaps
    monkeypatch.setattr(report, "measured_gaps", lambda spans, posts=None: tuple(0.1 * x for x in measured(spans, posts)))
    verdict = report.judge_replay(run)
    assert verdict.state == "failed" and "on a quiet machine" in verdict.detail


