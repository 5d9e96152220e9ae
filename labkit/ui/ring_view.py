"""Step through a simulated all-reduce: who sends which chunk to whom, and how full every worker's chunks are.

``chunk_contributions(result)`` replays the message log into counts (how many workers' inputs each worker's
copy of each chunk already contains, after each step); ``draw_step`` draws one step with matplotlib; ``ring_view``
wraps both in a Play button + slider (ipywidgets). The logic runs and is tested without a browser.
"""
from __future__ import annotations

import io
from typing import TYPE_CHECKING

import ipywidgets as widgets
import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from labkit.comm.collectives import AllreduceResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_VIEW_WORKERS = 16
CSS_CLASS = "labkit-ring-view"


def chunk_contributions(result: AllreduceResult) -> np.ndarray:
    """(steps+1, R, R) ints: after step s, how many inputs worker w's copy of chunk c combines (R = complete)."""
    world_size = result.world_size
    states = [np.ones((world_size, world_size), dtype=np.int64)]
    by_step: dict[int, list] = {}
    for msg in result.steps:
        by_step.setdefault(msg.step, []).append(msg)
    for step in range(result.num_steps):
        prev, new = states[-1], states[-1].copy()
        for msg in by_step.get(step, []):  # messages of one step are simultaneous: read the previous state
            chunks = slice(0, world_size) if msg.chunk is None else slice(msg.chunk, msg.chunk + msg.num_chunks)
            if msg.reduces:
                new[msg.receiver, chunks] += prev[msg.sender, chunks]
            else:
                new[msg.receiver, chunks] = prev[msg.sender, chunks]
        states.append(new)
    return np.stack(states)


def step_caption(result: AllreduceResult, step: int) -> str:
    """One line describing ``step`` (0 = the start; s = after the s-th communication step)."""
    if not 0 <= step <= result.num_steps:
        raise ValueError(f"step must be in [0, {result.num_steps}], got {step}")
    if step == 0:
        return f"{result.algorithm}: start, {result.world_size} workers each hold only their own data"
    msgs = [m for m in result.steps if m.step == step - 1]
    what = ", ".join(f"{m.sender}->{m.receiver}" + ("" if m.chunk is None else f" [chunk {m.chunk}"
                     + (f"..{m.chunk + m.num_chunks - 1}]" if m.num_chunks > 1 else "]")) for m in msgs[:8])
    more = f" (+{len(msgs) - 8} more)" if len(msgs) > 8 else ""
    kb = sum(m.nbytes for m in msgs) / 1e3
    return f"{result.algorithm} step {step}/{result.num_steps} ({msgs[0].phase}): {what}{more}; {kb:.2f} kB moved"


def _positions(world_size: int) -> np.ndarray:
    angles = np.pi / 2 - 2 * np.pi * np.arange(world_size) / world_size  # worker 0 at the top, clockwise
    return np.stack([np.cos(angles), np.sin(angles)], axis=1)


def draw_step(result: AllreduceResult, step: int, ax: Axes | None = None, states: np.ndarray | None = None) -> Axes:
    """Draw the workers on a circle, each with its R chunks shaded by completeness, and this step's messages."""
    if result.world_size > MAX_VIEW_WORKERS:
        raise ValueError(f"the step view draws at most {MAX_VIEW_WORKERS} workers, got {result.world_size}; "
                         "simulate a smaller world_size to look at, and a larger one to measure")
    if ax is None:
        ax = Figure(figsize=(5.2, 5.2)).add_subplot()

    world_size = result.world_size
    states = chunk_contributions(result) if states is None else states
    pos = _positions(world_size)
    width = 0.9 * min(1.0, 2.4 / world_size) if world_size > 1 else 0.5
    cmap = matplotlib.colormaps["viridis"]
    for w in range(world_size):
        x0, y0 = pos[w]
        for c in range(world_size):
            frac = states[step, w, c] / world_size
            chunk_w = width / world_size
            ax.add_patch(Rectangle((x0 - width / 2 + c * chunk_w, y0 - 0.08), chunk_w, 0.16,
                                   facecolor=cmap(frac), edgecolor="white", linewidth=0.5))
        ax.text(x0, y0 + 0.14, f"worker {w}", ha="center", fontsize=8)
    if step > 0:
        for m in (m for m in result.steps if m.step == step - 1):
            a, b = pos[m.sender] * 0.85, pos[m.receiver] * 0.85
            ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "->", "color": "crimson", "lw": 1.2,
                                                        "connectionstyle": "arc3,rad=0.15"})
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.4, 1.4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{result.algorithm}, step {step}/{result.num_steps}\n"
                 "chunk colour: share of workers' inputs combined (yellow = complete)", fontsize=9)
    return ax


def render_png(result: AllreduceResult, step: int, states: np.ndarray | None = None) -> bytes:
    """The drawing of ``step`` as PNG bytes (no pyplot, so no stray figures in the notebook)."""
    ax = draw_step(result, step, states=states)
    buf = io.BytesIO()
    ax.figure.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return buf.getvalue()


def ring_view(result: AllreduceResult) -> widgets.VBox:
    """A Play button and slider over ``result``'s steps, redrawing the workers' chunks; CSS class labkit-ring-view."""
    states = chunk_contributions(result)
    slider = widgets.IntSlider(value=0, min=0, max=result.num_steps, description="step", continuous_update=True)
    play = widgets.Play(value=0, min=0, max=result.num_steps, interval=900, description="play")
    widgets.jslink((play, "value"), (slider, "value"))
    caption = widgets.HTML(value=step_caption(result, 0))
    image = widgets.Image(value=render_png(result, 0, states), format="png",
                          layout=widgets.Layout(width="480px", height="auto"))   # native size: no blurry stretch

    def update(change: dict) -> None:
        step = int(change["new"])
        caption.value = step_caption(result, step)
        image.value = render_png(result, step, states)

    slider.observe(update, names="value")
    box = widgets.VBox([widgets.HBox([play, slider]), caption, image])
    box.add_class(CSS_CLASS)
    box.slider, box.caption, box.image = slider, caption, image  # handles for tests and notebooks
    return box


def complete_chunks_after(result: AllreduceResult, step: int) -> np.ndarray:
    """(R,) number of chunks each worker holds complete (all R inputs combined) after ``step``."""
    states = chunk_contributions(result)
    return (states[step] == result.world_size).sum(axis=1)

