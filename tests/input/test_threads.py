"""Tests for labkit.input.threads: sweep tables, restored settings, TF child processes, bad input."""
from __future__ import annotations

import pytest
import torch

from labkit.input.threads import ThreadSweep, default_thread_counts, sweep_tf_threads, sweep_torch_threads


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


@pytest.mark.tensorflow
def test_tf_sweep_in_children():
    sweep = sweep_tf_threads([(2, 1)], size=32, branches=2, warmup=1, repeats=2)   # one child: TF start-up is slow
    assert [(r["intra_seen"], r["inter_seen"]) for r in sweep.rows] == [(2, 1)]
    assert sweep.framework == "tensorflow" and all(r["median_s"] > 0 for r in sweep.rows)


def test_bad_tf_settings():
    with pytest.raises(ValueError, match="pair"):
        sweep_tf_threads([(1, 1, 1)])
    with pytest.raises(ValueError, match=r"each value in each \(intra, inter\) setting must be an integer >= 1"):
        sweep_tf_threads([(0, 1)])
