"""The step-through view: replayed chunk counts, captions, drawing and the widget, all without a browser."""
from __future__ import annotations

import numpy as np
import pytest

from labkit.comm.collectives import ALGORITHMS, allreduce
from labkit.ui.ring_view import (CSS_CLASS, chunk_contributions, complete_chunks_after, draw_step, render_png,
                              ring_view, step_caption)


def _result(algorithm: str, R: int = 4, n: int = 10):
    return allreduce([np.arange(n, dtype=np.float64) + 10 * i for i in range(R)], algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("R", [1, 2, 4, 8])
def test_every_worker_ends_with_every_chunk_complete(algorithm, R):
    states = chunk_contributions(_result(algorithm, R))
    assert states.shape[1:] == (R, R)
    np.testing.assert_array_equal(states[0], 1)
    np.testing.assert_array_equal(states[-1], R)
    assert states.max() <= R  # no input is ever counted twice


def test_ring_reduce_scatter_leaves_one_complete_chunk_per_worker():
    R = 5
    result = _result("ring", R)
    assert list(complete_chunks_after(result, R - 1)) == [1] * R
    assert list(complete_chunks_after(result, R - 2)) == [0] * R


def test_captions_describe_the_messages():
    result = _result("ring", 3)
    assert "start" in step_caption(result, 0)
    assert step_caption(result, 1).startswith("ring step 1/4 (reduce-scatter): 0->1 [chunk 0]")
    assert "(all-gather)" in step_caption(result, 4)
    with pytest.raises(ValueError, match="step must be in"):
        step_caption(result, 5)


def test_drawing_and_png():
    result = _result("halving_doubling", 4)
    ax = draw_step(result, 1)
    assert len(ax.patches) == 16 and len(ax.texts) >= 4
    assert render_png(result, 2)[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="at most 16 workers"):
        draw_step(_result("ring", 17, 17), 0)


def test_widget_updates_when_the_slider_moves():
    view = ring_view(_result("ring", 4))
    assert CSS_CLASS in view._dom_classes
    first_png, first_caption = view.image.value, view.caption.value
    view.slider.value = 3
    assert view.caption.value != first_caption and "step 3/6" in view.caption.value
    assert view.image.value != first_png
