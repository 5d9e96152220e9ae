"""The speedup explorer widget: sliders over ``labkit.parallel.data.speedup.explore``, with measured points overlaid.

The logic (``ExplorerSettings`` -> ``explore()``) lives in ``labkit.parallel.data.speedup``, plain Python tested
without a browser; this ipywidgets panel only decorates it.

Browser hooks: the top box has CSS class ``labkit-explorer``; the readout (class ``labkit-readout``)
shows the speedup and efficiency numbers; slider descriptions are in ``SLIDER_DESCRIPTIONS``.
"""
from __future__ import annotations

from dataclasses import replace

import ipywidgets as w
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import clear_output, display
from matplotlib.figure import Figure

from labkit.parallel.data.scaling import ScalingPoint
from labkit.parallel.data.speedup import (ExplorerResult, ExplorerSettings, explore, measured_overlay_text, readout_text,
                                    speedup_curve)
from labkit.training.flops import measured_training_flops_per_s

SLIDER_DESCRIPTIONS = {"world_size": "Replicas", "batch": "Batch", "model_params_m": "Params (M)",
                       "latency_us": "Latency (us)", "bandwidth_gb_s": "Bandwidth (GB/s)",
                       "ranks_per_node": "Ranks per node", "inter_latency_us": "Node link lat. (us)",
                       "inter_bandwidth_gb_s": "Node link (GB/s)"}
ALGORITHM_CHOICES = (("flat ring", "flat"), ("two-level", "hierarchical"))


def plot_explorer(settings: ExplorerSettings, measured: list[ScalingPoint] | None = None,
                  max_world_size: int = 64) -> Figure:
    """Speedup and efficiency against R for ``settings``; measured points (and their predictions) overlaid."""
    sizes = list(range(1, max(max_world_size, settings.world_size) + 1))
    curve = speedup_curve(settings, sizes)
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax_s.plot(sizes, sizes, "k--", lw=1, label="ideal")
    ax_s.plot(sizes, curve, label="predicted")
    ax_s.plot([settings.world_size], [explore(settings).speedup], "o", color="C0")
    if settings.ranks_per_node is not None and settings.ranks_per_node < sizes[-1]:
        ax_s.axvline(settings.ranks_per_node + 0.5, color="gray", ls=":", lw=1, label="the node link enters")
    ax_e.plot(sizes, 100 * curve / np.array(sizes), color="C1")
    ax_e.axvline(settings.world_size, color="gray", lw=0.8)
    for i, p in enumerate(measured or []):
        ax_s.plot(p.world_size, p.measured_speedup, "r^", label=None if i else "measured run (gloo)")
        ax_s.plot(p.world_size, p.predicted_speedup, "rx", label=None if i else "its prediction")
    ax_s.set(xlabel="replicas R", ylabel="speedup", title="Speedup (x: measured run's prediction)")
    ax_e.set(xlabel="replicas R", ylabel="efficiency (%)", ylim=(0, 105), title="Efficiency = speedup / R")
    ax_s.legend(fontsize=8)
    fig.tight_layout()
    return fig


class SpeedupExplorer:
    """The ipywidgets panel around ``explore``: ``SpeedupExplorer().widget`` in a notebook cell."""

    def __init__(self, settings: ExplorerSettings | None = None, measured: list[ScalingPoint] | None = None,
                 max_world_size: int = 64, draw: bool = True) -> None:
        s = settings or ExplorerSettings()
        if s.device_flops_per_s is None:                   # this device's sustained training rate, measured once
            s = replace(s, device_flops_per_s=measured_training_flops_per_s()[0])
        self.base, self.measured, self.max_world_size, self.draw = s, list(measured or []), max_world_size, draw
        d, style = SLIDER_DESCRIPTIONS, {"description_width": "120px"}
        self.sliders = {
            "world_size": w.IntSlider(value=s.world_size, min=1, max=max_world_size, description=d["world_size"],
                                      style=style),
            "batch": w.IntSlider(value=s.batch, min=1, max=1024, description=d["batch"], style=style),
            "model_params_m": w.FloatLogSlider(value=s.model_params_m, base=10, min=-1, max=3,
                                               description=d["model_params_m"], style=style),
            "latency_us": w.FloatLogSlider(value=max(s.latency_us, 0.1), base=10, min=-1, max=4,
                                           description=d["latency_us"], style=style),
            "bandwidth_gb_s": w.FloatLogSlider(value=s.bandwidth_gb_s, base=10, min=-2, max=3,
                                               description=d["bandwidth_gb_s"], style=style),
        }
        rpn = s.ranks_per_node if s.ranks_per_node is not None else max_world_size
        self.tier_sliders = {
            "ranks_per_node": w.IntSlider(value=min(rpn, max_world_size), min=1, max=max_world_size,
                                          description=d["ranks_per_node"], style=style),
            "inter_latency_us": w.FloatLogSlider(value=max(s.inter_latency_us, 0.1), base=10, min=-1, max=4,
                                                 description=d["inter_latency_us"], style=style),
            "inter_bandwidth_gb_s": w.FloatLogSlider(value=s.inter_bandwidth_gb_s, base=10, min=-2, max=3,
                                                     description=d["inter_bandwidth_gb_s"], style=style),
        }
        self.algorithm = w.ToggleButtons(options=ALGORITHM_CHOICES,
                                         value=s.algorithm if s.algorithm == "hierarchical" else "flat",
                                         description="All-reduce", style=style)
        self.readout = w.HTML()
        self.readout.add_class("labkit-readout")
        self.measured_label = w.HTML(f"<b>Measured here:</b> {measured_overlay_text(self.measured)}"
                                     if self.measured else "")
        self.plot = w.Output()
        self.widget = w.VBox([*self.sliders.values(), *self.tier_sliders.values(), self.algorithm, self.readout,
                              self.measured_label, self.plot])
        self.widget.add_class("labkit-explorer")
        for control in (*self.sliders.values(), *self.tier_sliders.values(), self.algorithm):
            control.observe(self.update, names="value")
        self.update()

    def settings(self) -> ExplorerSettings:
        """The settings the sliders show now (ranks per node at its maximum: every replica in one node)."""
        sliders = {**self.sliders, **self.tier_sliders}
        values = {k: (int(v.value) if k in ("world_size", "batch", "ranks_per_node") else float(v.value))
                  for k, v in sliders.items()}
        return replace(self.base, **values, algorithm=self.algorithm.value)

    def update(self, change: object = None) -> ExplorerResult:
        """Recompute from the sliders, refresh the readout and (if drawing) the plot."""
        settings = self.settings()
        result = explore(settings)
        self.readout.value = f"<span>{readout_text(settings, result)}</span>"
        if self.draw:
            with self.plot:
                clear_output(wait=True)
                fig = plot_explorer(settings, self.measured, self.max_world_size)
                display(fig)
                plt.close(fig)
        return result

    def _ipython_display_(self) -> None:
        display(self.widget)
