"""Tests for labkit.ui.pitfall_views: notebook 09's measured pitfalls drawn bar by bar from given evidence."""
from __future__ import annotations

import matplotlib
import pytest

from labkit.parallel.debug.data_pitfalls import ShardedEvalEvidence, shard_coverage
from labkit.ui.pitfall_views import CLAIM_FACTOR, plot_eval_accuracy, plot_samples_per_s, plot_shard_reads

matplotlib.use("Agg")


def test_one_bar_per_batch_size_at_its_rate_and_the_claims_line_at_twice_the_smallest():
    ax = plot_samples_per_s({64: 9000.0, 2: 1500.0}, "cpu")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["batch 2", "batch 64"]
    assert [p.get_height() for p in ax.patches] == pytest.approx([1500.0, 9000.0])
    assert [ln.get_ydata()[0] for ln in ax.lines] == pytest.approx([CLAIM_FACTOR * 1500.0])
    assert "cpu" in ax.get_title() and "9,000" in [t.get_text() for t in ax.texts]
    with pytest.raises(ValueError, match="no throughputs"):
        plot_samples_per_s({}, "cpu")


def test_reads_are_stacked_one_segment_per_rank_beside_the_distinct_samples():
    without, with_sampler = shard_coverage(1000, 8, use_sampler=False), shard_coverage(1000, 8, use_sampler=True)
    ax = plot_shard_reads(without, with_sampler)
    read = [p for p in ax.patches if not p.get_hatch()]
    distinct = [p for p in ax.patches if p.get_hatch()]
    assert len(read) == 8 + 8 and len(distinct) == 2                  # a segment per rank, in both bars
    no_sampler_top = max(p.get_y() + p.get_height() for p in read if p.get_x() < 0)
    sampler_top = max(p.get_y() + p.get_height() for p in read if p.get_x() > 0.5)
    assert no_sampler_top == pytest.approx(8000) and sampler_top == pytest.approx(1000)
    assert [p.get_height() for p in distinct] == pytest.approx([1000, 1000])
    assert "8,000 read\n(8 ranks)" in [t.get_text() for t in ax.texts]


def test_three_accuracy_bars_with_the_samples_each_evaluated_and_the_exact_line():
    ev = ShardedEvalEvidence(exact_accuracy=0.8, padded_accuracy=8 / 12, padded_samples_seen=12, fixed_accuracy=0.8,
                             fixed_samples_seen=10)
    ax = plot_eval_accuracy(ev)
    assert [p.get_height() for p in ax.patches] == pytest.approx([0.8, 8 / 12, 0.8])
    assert [ln.get_ydata()[0] for ln in ax.lines] == pytest.approx([0.8])
    texts = [t.get_text() for t in ax.texts]
    assert "0.667\nover 12 samples" in texts and "0.800\nover 10 samples" in texts
