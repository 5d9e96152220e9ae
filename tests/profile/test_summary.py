"""Tests for labkit.profile.summary: two profiled runs compared by category and by operator."""
from __future__ import annotations

import pytest

from labkit.profile.profiler import profile_training
from labkit.profile.summary import changed_ops, compare_runs
from tests.profile.test_profiler import tiny_loader, tiny_model


def test_compare_and_changed_ops(tmp_path):
    runs = {f"bs{b}": profile_training(tiny_model(), tiny_loader(batch=b), run_dir=tmp_path / str(b), active=2)
            for b in (1, 8)}
    table = compare_runs(runs)
    assert list(table.columns) == ["bs1", "bs8"] and "total" in table.index
    rows = changed_ops(runs["bs1"], runs["bs8"], top=3)
    assert len(rows) == 3 and all(r["change"] == pytest.approx(r["share_b"] - r["share_a"]) for r in rows)
    with pytest.raises(ValueError, match="two or more"):
        compare_runs({"only": runs["bs1"]})
