"""Tests for labkit.ui.hang_view: a hand-made hang drawn box by box from its records, waits and outcomes."""
from __future__ import annotations

import matplotlib
import pytest

from labkit.parallel.debug.flight_recorder import Divergence, Entry
from labkit.parallel.debug.hangs import HangEvidence
from labkit.ui.hang_view import BOX_WIDTH, plot_hang, rank_outcome

matplotlib.use("Agg")

AR1, AR64 = {"op": "all_reduce", "sizes": [[1]]}, {"op": "all_reduce", "sizes": [[64]]}
TIMEOUT = "DistBackendError: [../gloo.cc] Timed out waiting 2000ms for recv operation to complete"


def _skipped() -> HangEvidence:
    """Section 1's shape: ranks 0 and 1 enter #1-#5, rank 2 skipped a step and stops after #4; 0 and 1 time out."""
    full = [{**op, "seq": s} for s, op in zip(range(1, 6), (AR1, AR64, AR1, AR64, AR1))]
    d = Divergence(5, (2,), "missing", Entry(5, "all_reduce", ((1,),), ""), {2: None}, {})
    errors = {0: {"error": TIMEOUT, "waited_s": 2.03, "step": 2}, 1: {"error": TIMEOUT, "waited_s": 2.01, "step": 2}}
    return HangEvidence("skipped", "default", 2, 3, 2.0, 9.0, "rank 0 failed", errors, d, "", "gloo",
                        {0: full, 1: full, 2: full[:4]}, {"scheduled": 14})


def _boxes(ax):
    return [p for p in ax.patches if p.get_width() == pytest.approx(BOX_WIDTH)]


def test_one_box_per_recorded_collective_and_a_dashed_one_where_the_culprit_never_entered():
    ev = _skipped()
    records, waits = plot_hang(ev).axes
    boxes = _boxes(records)
    assert len(boxes) == 5 + 5 + 4 + 1                    # every record, plus rank 2's missing #5
    never = [p for p in boxes if not p.get_fill()]
    assert len(never) == 1 and never[0].get_x() == pytest.approx(5 - BOX_WIDTH / 2)
    assert never[0].get_y() + never[0].get_height() / 2 == pytest.approx(2)          # on rank 2's row
    hatched = [p for p in boxes if p.get_hatch()]
    assert sorted(p.get_y() + p.get_height() / 2 for p in hatched) == pytest.approx([0, 1])  # where 0 and 1 waited
    assert [t.get_text() for t in records.texts].count("never\nentered") == 1
    assert "all_reduce\n[64]" in [t.get_text() for t in records.texts]


def test_the_wait_panel_has_a_bar_per_rank_the_waits_measured_and_the_timeout_line():
    ev = _skipped()
    waits = plot_hang(ev).axes[1]
    assert [p.get_width() for p in waits.patches] == pytest.approx([2.03, 2.01, 0.0])
    assert [ln.get_xdata()[0] for ln in waits.lines] == [2.0]
    texts = [t.get_text() for t in waits.texts]
    assert "timed out after 2.0 s" in texts and "raised nothing" in texts


def test_outcomes_read_off_the_notes_and_the_launcher_and_a_rank_without_a_record_is_named():
    ev = _skipped()
    assert [rank_outcome(ev, r) for r in range(3)] == ["timed out", "timed out", "raised nothing"]
    dead = HangEvidence("dead", "default", 2, 3, 2.0, 9.0, "rank 2 was killed by SIGKILL (exit code -9)",
                        {0: {"error": "RuntimeError: Connection closed by peer", "waited_s": 0.4, "step": 1}},
                        Divergence(None, (2,), "no dump", None, {}, {}), "", "gloo",
                        {0: [{**AR1, "seq": 1}], 1: [{**AR1, "seq": 1}], 2: []}, {})
    assert [rank_outcome(dead, r) for r in range(3)] == ["RuntimeError", "raised nothing", "killed by SIGKILL"]
    records = plot_hang(dead, title="dead").axes[0]
    assert len(_boxes(records)) == 2 and records.get_title() == "dead"
    assert "rank 2: no flight record" in [t.get_text() for t in records.texts]
