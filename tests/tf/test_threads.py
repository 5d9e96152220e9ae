"""Tests for labkit.tf.threads: TensorFlow thread pools swept in child processes, bad input."""
from __future__ import annotations

import pytest

from labkit.tf.threads import sweep_tf_threads


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
