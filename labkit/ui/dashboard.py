"""The live batch-size dashboard: pick a batch size and model, press Run, watch memory, throughput and
accuracy update while :func:`labkit.training.loop.train` runs in a background thread; earlier runs stay for
comparison; Stop ends a run cleanly.

The widget only decorates functions that run without it; its logic is driven in tests by setting
``.value`` and calling ``.click()``, and ``dash.run(blocking=True)`` runs without a browser.
"""
from __future__ import annotations

import html
import io
import statistics
import threading
from dataclasses import dataclass, field

import ipywidgets as W
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch.utils.data import Subset

from labkit.core.clock import now_s
from labkit.core.data import ImageData, load_data, make_loader, validate_batch_size
from labkit.core.env import pick
from labkit.core.models import build_model
from labkit.core.validation import checked_int, positive_int
from labkit.memory.device import cuda_baseline_bytes
from labkit.training.batch_rules import scaled_lr
from labkit.training.config import TrainConfig
from labkit.training.loop import evaluate_accuracy, train
from labkit.training.run_memory import measure_run_memory, predict_run_memory

COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52", "activations": "#8172b2"}


@dataclass
class DashboardRun:
    """One dashboard run: its settings and what was measured while it ran."""

    model: str
    batch_size: int
    lr: float
    total_steps: int
    points: list = field(default_factory=list)      # dicts: step, samples_per_s, step_time_ms, loss
    accuracy: list = field(default_factory=list)    # (step, val accuracy)
    memory: object | None = None                    # labkit.memory.model.MemoryBreakdown (predicted)
    measured_bytes: int | None = None               # GPU: peak minus the baseline; CPU: counted activations + rest
    result: object | None = None                    # labkit.training.loop.RunResult when finished
    stopped: bool = False
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.model} bs={self.batch_size}"


def memory_bars_html(runs: list[DashboardRun]) -> str:
    """Stacked horizontal bars (params / grads / optimizer / activations) per run, measured peak marked."""
    sized = [r for r in runs if r.memory is not None]
    if not sized:
        return "<i>memory: waiting for the first run</i>"
    scale = max(max(r.memory.total_bytes, r.measured_bytes or 0) for r in sized)
    rows = []
    for r in sized[-6:]:
        parts = r.memory.as_dict_mb()
        segs = "".join(f'<div title="{k} {parts[k]:.1f} MB" style="background:{COLORS[k]};height:14px;'
                       f'width:{100 * getattr(r.memory, k + "_bytes") / scale:.2f}%"></div>' for k in COLORS)
        mark = ""
        if r.measured_bytes:
            mark = (f'<div style="position:absolute;left:{100 * r.measured_bytes / scale:.2f}%;top:-2px;'
                    'width:2px;height:18px;background:black" title="measured"></div>')
        meas = f", measured {r.measured_bytes / 1e6:.1f} MB" if r.measured_bytes else ""
        rows.append(f'<div style="font-size:11px">{html.escape(r.label)}: predicted {parts["total"]:.1f} MB{meas}'
                    f'</div><div style="position:relative;display:flex;width:100%">{segs}{mark}</div>')
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {k}' for k, c in COLORS.items())
    return f'<div style="width:420px"><b>Memory</b> ({legend}; black tick = measured)' + "".join(rows) + "</div>"


def curves_png(runs: list[DashboardRun]) -> bytes:
    """Throughput and accuracy curves of every run as one PNG (matplotlib's OO API: safe off the main thread)."""
    fig = Figure(figsize=(8, 2.6), dpi=72)
    FigureCanvasAgg(fig)
    ax_t, ax_a = fig.subplots(1, 2)
    for r in runs:
        if r.points:
            ax_t.plot([p["step"] for p in r.points], [p["samples_per_s"] for p in r.points], label=r.label)
        if r.accuracy:
            ax_a.plot(*zip(*r.accuracy), marker="o", label=r.label)
    ax_t.set(xlabel="step", ylabel="samples/s", title="throughput")
    ax_a.set(xlabel="step", ylabel="val accuracy", title="accuracy", ylim=(0, 1))
    if any(r.points for r in runs):
        ax_t.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class BatchSizeDashboard:
    """``dash = BatchSizeDashboard(); display(dash.widget)`` — or ``dash.run(blocking=True)`` in code."""

    def __init__(self, data=None, models: tuple[str, ...] = ("small_cnn", "resnet18", "mlp"),
                 batch_size: int = 32, steps: int | None = None, base_lr: float = 0.05, base_batch: int = 32,
                 update_every: int = 2, eval_every: int = 10, eval_samples: int = 128, device: str | None = None):
        self._data, self.device = data, device
        self.base_lr, self.base_batch = base_lr, base_batch
        self.update_every = positive_int(update_every, "update_every")
        self.eval_every = checked_int(eval_every, "eval_every", minimum=0, hint="0 evaluates only at the end")
        self.eval_samples = positive_int(eval_samples, "eval_samples")
        self.history: list[DashboardRun] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_plot_s = 0.0
        self.batch_size = W.IntText(value=batch_size, description="Batch size")
        self.model_name = W.Dropdown(options=list(models), value=models[0], description="Model")
        self.lr_scaling = W.Checkbox(value=True, description="Linear LR scaling + warm-up")
        self.steps = W.IntText(value=steps or pick(fast=30, full=300), description="Steps")
        self.run_button = W.Button(description="Run", button_style="success")
        self.stop_button = W.Button(description="Stop", button_style="danger", disabled=True)
        self.readout = W.HTML("press Run").add_class("labkit-readout")
        self.status = W.HTML("")
        self.memory_view = W.HTML(memory_bars_html([]))
        self.curves_view = W.Image(format="png")
        self.run_button.on_click(lambda _: self.run(blocking=False))
        self.stop_button.on_click(lambda _: self.stop())
        controls = W.HBox([W.VBox([self.model_name, self.batch_size]), W.VBox([self.steps, self.lr_scaling]),
                           W.VBox([self.run_button, self.stop_button])])
        self.widget = W.VBox([controls, self.readout, self.status, self.memory_view, self.curves_view])
        self.widget.add_class("labkit-dashboard")

    # ------------------------------------------------------------------ control
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def data(self) -> ImageData:
        """The dataset (loaded on first use: digits offline, CIFAR-10 when available)."""
        if self._data is None:
            self._data = load_data(train_limit=pick(fast=512, full=None), val_limit=pick(fast=256, full=None))
        return self._data

    def run(self, blocking: bool = True) -> DashboardRun | None:
        """Start a run with the current widget values; ``blocking=True`` waits for it and returns it."""
        if self.running:
            self.status.value = "<b>a run is already going: press Stop first</b>"
            return None
        self._stop.clear()
        self.run_button.disabled, self.stop_button.disabled = True, False
        self._thread = threading.Thread(target=self._run_safely, daemon=True, name="labkit-dashboard")
        self._thread.start()
        if blocking:
            self.wait()
            return self.history[-1] if self.history else None
        return None

    def stop(self) -> None:
        """Ask the running training to stop after its current step."""
        self._stop.set()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the current run has finished."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ the run (background thread)
    def _run_safely(self) -> None:
        try:
            self._train_once()
        except Exception as err:  # noqa: BLE001 - shown in the panel, never a silent dead thread
            self.status.value = (f'<span style="color:#c44e52"><b>{type(err).__name__}:</b> '
                                 f'{html.escape(str(err))}</span>')
            if self.history and self.history[-1].result is None:
                self.history[-1].error = str(err)
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True

    def _train_once(self) -> None:
        """Validate the widget values once, scale the LR (Goyal et al. 2017), then ``train()`` with a callback."""
        data = self.data()
        bs = validate_batch_size(self.batch_size.value, len(data.train), "Batch size")
        steps = positive_int(self.steps.value, "Steps")
        lr = scaled_lr(self.base_lr, bs, self.base_batch) if self.lr_scaling.value else self.base_lr
        run = DashboardRun(self.model_name.value, bs, lr, steps)
        self.history.append(run)
        self.status.value = f"running {run.label}, lr {lr:.4g} ..."
        model = build_model(run.model, data.num_classes, data.image_shape)
        baseline = cuda_baseline_bytes()
        cfg = TrainConfig(steps=steps, lr=lr, lr_warmup_steps=5 if self.lr_scaling.value else 0, device=self.device,
                          progress=False, warmup_steps=min(2, steps - 1), profile_model=False)
        result = train(model, make_loader(data.train, bs, shuffle=True), cfg,
                       val_loader=make_loader(data.val, min(len(data.val), 256)),
                       callback=lambda rec, progress: self._on_step(run, rec, progress, baseline))
        run.result, run.stopped = result, result.stopped_early
        if result.val_accuracy is not None:
            run.accuracy.append((len(result.steps), result.val_accuracy))
        self._render(run, force=True)
        word = "stopped" if run.stopped else "finished"
        self.status.value = (f"{word} {run.label}: {result.samples_per_s_median:.1f} samples/s (median), "
                             f"val accuracy {result.val_accuracy:.3f} on {html.escape(result.device)}")

    def _on_step(self, run: DashboardRun, rec, progress, baseline_bytes: int | None) -> bool:
        """Training-thread callback (gets ``train``'s public TrainProgress): record, refresh, honour Stop."""
        run.points.append(dict(step=rec.step + 1, samples_per_s=rec.samples_per_s,
                               step_time_ms=1e3 * rec.step_time_s, loss=rec.loss))
        n = rec.step + 1
        if run.memory is None:
            run.memory = predict_run_memory(progress, run.batch_size)
        if run.measured_bytes is None or (baseline_bytes is not None and n == 2):
            run.measured_bytes = measure_run_memory(progress, run.memory, baseline_bytes)
        if self.eval_every and n % self.eval_every == 0 and n < run.total_steps:
            run.accuracy.append((n, self._quick_accuracy(progress.model)))
        if n == 1 or n % self.update_every == 0 or self._stop.is_set():
            self._render(run)
        return self._stop.is_set()

    def _quick_accuracy(self, model) -> float:
        val = self.data().val
        sub = Subset(val, range(min(self.eval_samples, len(val))))
        return evaluate_accuracy(model, make_loader(sub, len(sub)))

    def _render(self, run: DashboardRun, force: bool = False) -> None:
        pts = run.points[-5:]
        if pts:
            sps = statistics.median(p["samples_per_s"] for p in pts)
            ms = statistics.median(p["step_time_ms"] for p in pts)
            peak = (run.measured_bytes or run.memory.total_bytes) / 1e6
            acc = f" · val accuracy {run.accuracy[-1][1]:.3f}" if run.accuracy else ""
            self.readout.value = (f"<b>{html.escape(run.label)}</b> · step {run.points[-1]['step']}/{run.total_steps}"
                                  f" · {sps:.1f} samples/s · step time {ms:.1f} ms · peak memory {peak:.1f} MB"
                                  f" · loss {run.points[-1]['loss']:.3f}{acc}")
        self.memory_view.value = memory_bars_html(self.history)
        now = now_s()
        if force or now - self._last_plot_s > 1.0:
            self.curves_view.value = curves_png(self.history)
            self._last_plot_s = now

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

