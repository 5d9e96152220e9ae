"""Tests for labkit.input.threads: sweep tables, restored settings, bad input."""
from __future__ import annotations

import pytest
import torch

from labkit.input.threads import default_thread_counts, sweep_torch_threads
from labkit.tf.threads import ThreadSweep


def test_default_thread_counts():
    assert default_thread_counts(2) == [1, 2, 4]
    assert default_thread_counts(8) == [1, 2, 4, 8, 16]
    assert default_thread_counts(1) == [1, 2]


def test_torch_sweep_restores_threads():
    before = torch.get_num_threads()
    seen = []
    sweep = sweep_torch_threads([1, 2], fn=lambda: seen.append(torch.get_num_threads()), warmup=0, repeats=2)
    assert torch.get_num_threads() == before
    assert seen == [1, 1, 2, 2]
    assert isinstance(sweep, ThreadSweep) and [r["intra"] for r in sweep.rows] == [1, 2]
    assert sweep.rows[0]["speedup_vs_first"] == 1.0
    assert sweep.best() in sweep.rows
    assert list(sweep.to_dataframe().index) == ["1 threads", "2 threads"]


def test_torch_sweep_restores_threads_on_error():
    before = torch.get_num_threads()

    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        sweep_torch_threads([1], fn=boom)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("counts", [[], [0], [1.5], [True]])
def test_bad_thread_counts(counts):
    with pytest.raises(ValueError, match="thread_counts is empty|each value in thread_counts must be an integer >= 1"):
        sweep_torch_threads(counts, fn=lambda: None)
