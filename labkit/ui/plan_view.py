"""The planner as a widget: sliders for the model, the GPUs and the cluster; the fastest layouts that fit, their
memory and step time by term, and why the first wins. ``plan_summary`` is the logic (tested without a browser);
``plan_view`` wraps it in ipywidgets (STYLE.md rule 11).
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import pandas as pd

from labkit.plan.planner import plan, why_it_wins
from labkit.plan.specs import ClusterSpec, DeviceSpec, ModelSpec

SHOWN = ("layout", "memory_GiB", "step_s", "compute s", "TP all-reduces s", "CP ring (exposed) s", "PP sends s",
         "pipeline bubble s", "DP gradient sync s")


def plan_summary(layers: int, hidden: int, heads: int, seq_len: int, vocab: int, global_batch: int,
                 gpu: str, memory_gib: float, gpus_per_node: int, nodes: int, top: int = 5) -> tuple[pd.DataFrame, str]:
    """(the top layouts that fit, by term; the reason the first wins), or an empty table and the one-line error."""
    try:
        model = ModelSpec(layers, hidden, heads, seq_len, vocab, global_batch=global_batch, name="model")
        ranked = plan(model, DeviceSpec.from_table(gpu, memory_gib), ClusterSpec(gpus_per_node, nodes))
    except ValueError as err:
        return pd.DataFrame(columns=list(SHOWN)), f"cannot plan: {err}"
    rows = [p.row() for p in ranked if p.fits][:top]
    return pd.DataFrame(rows, columns=list(SHOWN)), why_it_wins(ranked)


def plan_view(gpu: str = "NVIDIA H100 SXM") -> widgets.VBox:
    """Sliders -> the planner's table and its reason, recomputed on every change."""
    ints = {"layers": (32, 1, 160), "hidden": (4096, 256, 20480), "heads": (32, 1, 160), "seq_len": (4096, 256, 65536),
            "global_batch": (64, 1, 1024), "gpus_per_node": (8, 1, 16), "nodes": (1, 1, 64)}
    controls = {k: widgets.IntSlider(value=v, min=lo, max=hi, description=k, continuous_update=False)
                for k, (v, lo, hi) in ints.items()}
    controls["memory_gib"] = widgets.FloatSlider(value=80, min=8, max=192, step=8, description="GiB per GPU",
                                                 continuous_update=False)
    out = widgets.HTML()

    def update(_: object = None) -> None:
        table, reason = plan_summary(vocab=32000, gpu=gpu, **{k: c.value for k, c in controls.items()})
        out.value = f"<p>{html.escape(reason)}</p>" + table.round(3).to_html(index=False)

    for control in controls.values():
        control.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox([widgets.VBox(list(controls.values())[:4]),
                                       widgets.VBox(list(controls.values())[4:])]), out])
