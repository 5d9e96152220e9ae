"""Tests for labkit.profile.timeline: one step of a hand-made trace drawn as one bar per labelled phase."""
from __future__ import annotations

import matplotlib
import pytest

from labkit.profile.timeline import pick_step, plot_step_timeline, plot_step_timelines, step_phases

matplotlib.use("Agg")


def _span(name, ts, dur, tid=1, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


# step 4 is 1000 us, step 5 is 500 us, step 6 is 2000 us: the median step is #4
TRACE = {"traceEvents": [
    _span("ProfilerStep#4", 0, 1000), _span("labkit/data_loading", 0, 100), _span("labkit/forward", 100, 300),
    _span("aten::addmm", 150, 50, cat="cpu_op"), _span("labkit/backward", 400, 400),
    _span("labkit/optimizer", 800, 100), _span("labkit/sync", 950, 10),
    _span("labkit/forward", 200, 100, tid=2),               # another thread's label: not this step's phase
    _span("ProfilerStep#5", 1000, 500), _span("labkit/forward", 1000, 500),
    _span("ProfilerStep#6", 1500, 2000), _span("labkit/data_loading", 1500, 1900), _span("labkit/forward", 3400, 50)]}


def test_the_median_step_is_picked_and_a_missing_step_is_refused_with_the_steps_there_are():
    assert pick_step(TRACE)["name"] == "ProfilerStep#4"
    assert pick_step(TRACE, 6)["name"] == "ProfilerStep#6"
    with pytest.raises(ValueError, match=r"\[4, 5, 6\]"):
        pick_step(TRACE, 9)
    with pytest.raises(ValueError, match="no ProfilerStep"):
        pick_step({"traceEvents": []})


def test_phases_are_the_steps_own_labels_on_its_thread_in_seconds_from_its_start():
    phases = step_phases(TRACE, pick_step(TRACE, 4))
    assert [p.category for p in phases] == ["data_loading", "forward", "backward", "optimizer", "sync"]
    assert phases[2].start_s == pytest.approx(400e-6) and phases[2].duration_s == pytest.approx(400e-6)
    assert [p.category for p in step_phases(TRACE, pick_step(TRACE, 6))] == ["data_loading", "forward"]


def test_one_bar_per_phase_plus_the_step_and_one_labelled_row_per_category():
    ax = plot_step_timeline(TRACE, step=4)
    assert len(ax.patches) == 1 + 5                       # the whole step, then each labelled phase
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("ProfilerStep#4") and "1.00 ms" in labels[0]
    assert [lab.split()[0] for lab in labels[1:]] == ["data_loading", "forward", "backward", "optimizer", "sync"]
    assert "0.01 ms" in labels[-1]                        # a phase too short to see still reads off its label
    widths = sorted(p.get_width() for p in ax.patches)
    assert widths[-1] == pytest.approx(1.0) and widths[0] == pytest.approx(0.01)      # milliseconds


def test_several_steps_share_one_time_axis_so_the_longer_step_is_longer():
    short = {"traceEvents": [_span("ProfilerStep#1", 0, 500), _span("labkit/forward", 0, 400)]}
    fig = plot_step_timelines({"short": short, "typical": TRACE})
    assert [ax.get_title() for ax in fig.axes] == ["short", "typical"]
    assert fig.axes[0].get_xlim() == pytest.approx(fig.axes[1].get_xlim())      # both reach the 1 ms step's end
    assert fig.axes[0].get_xlim()[1] == pytest.approx(1.01)
    assert max(p.get_width() for p in fig.axes[0].patches) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no traces"):
        plot_step_timelines({})
