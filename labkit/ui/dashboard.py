"""The live batch-size dashboard: pick a model and a batch (a slider over powers of two, bounded by what fits),
press Run, and watch accuracy by samples seen and by seconds, loss, throughput against the device-resident
ceiling and memory against the device's capacity, while :func:`labkit.training.loop.train` runs in a
background thread. Earlier runs stay for comparison in plots and a results table; Stop ends a run cleanly;
a second Run while one runs is refused with a message.

Each run is one :class:`labkit.training.run_spec.RunSpec`, checked once. The widget only decorates functions that
run without it (:mod:`labkit.ui.batch_runs`, ``batch_limits``, ``batch_views``); tests set ``.value``, ``.click()``.
"""
from __future__ import annotations

import html
import statistics
import threading

import ipywidgets as W
from torch.utils.data import Subset

from labkit.core.clock import now_s
from labkit.core.data import ImageData, load_data, make_loader
from labkit.core.device import get_device
from labkit.core.env import deterministic_kernels, pick, seed_everything
from labkit.core.models import build_model
from labkit.core.validation import checked_int, positive_int
from labkit.memory.device import cuda_baseline_bytes, peak_since
from labkit.memory.model import MemoryModel
from labkit.training.batch_rules import scaled_lr
from labkit.training.ceiling import measure_ceiling
from labkit.training.config import TrainConfig
from labkit.training.loop import evaluate_accuracy, train
from labkit.training.run_memory import measure_run_memory
from labkit.training.run_spec import RunSpec
from labkit.ui.batch_limits import BatchLimit, batch_limit, fit_verdict, power_of_two_batches, slider_labels
from labkit.ui.batch_runs import DashboardRun, knee_of_runs
from labkit.ui.batch_views import curves_png, memory_bars_html, results_html

PLOT_EVERY_S = 1.0          # curves redraw at most this often (a PNG redraw costs ~0.1 s of a CPU core)
CPU_BUDGET_BYTES = 256 * 10**6   # a CPU has no card to fill: the default budget (notebook 02's finder uses the same)
# torch's random generator and cuDNN flags are per process: two dashboards training at once draw from one generator
ONE_TRAINING_AT_A_TIME = threading.Lock()


class BatchSizeDashboard:
    """``dash = BatchSizeDashboard(data=data, memory_budget_bytes=...); display(dash.widget)`` or ``dash.run()``."""

    def __init__(self, data=None, models: tuple[str, ...] = ("small_cnn", "resnet18", "mlp"),
                 batch_size: int = 32, steps: int | None = None, base_lr: float = 0.05, base_batch: int = 32,
                 update_every: int = 2, eval_every_samples: int | None = None, eval_samples: int = 128, device: str | None = None,
                 memory_budget_bytes: int | None = None, safety_margin: float = 0.1, target_accuracy: float = 0.8,
                 knees: dict[str, int] | None = None, ceiling_steps: int = 8, seed: int = 0):
        self._data, self.device = data, get_device(device)
        # every run is this recipe (SGD, momentum 0.9) with its own model, batch, lr and seed
        self.base_run = RunSpec(model=models[0], batch_size=base_batch, lr=base_lr, optimizer="sgd", momentum=0.9)
        self.base_lr, self.base_batch = self.base_run.lr, self.base_run.batch_size
        self.budget_bytes = CPU_BUDGET_BYTES if memory_budget_bytes is None else memory_budget_bytes
        self.update_every = positive_int(update_every, "update_every")
        # evaluations on one grid of samples seen for every batch size, so accuracy curves compare like with like
        self.eval_every_samples = checked_int(pick(fast=128, full=2048) if eval_every_samples is None
                                              else eval_every_samples, "eval_every_samples", minimum=0,
                                              hint="0 evaluates only at the end")
        self.eval_samples = positive_int(eval_samples, "eval_samples")
        self.ceiling_steps = checked_int(ceiling_steps, "ceiling_steps", minimum=0, hint="0 skips the ceiling")
        self.safety_margin, self.knees = safety_margin, dict(knees or {})
        self.history: list[DashboardRun] = []
        self._limits: dict[str, tuple[MemoryModel, BatchLimit]] = {}
        self._stop, self._lock, self._idle = threading.Event(), threading.Lock(), threading.Event()
        self._idle.set()    # not Thread.join: a join that Ctrl-C interrupted marks a running thread as ended (3.11)
        self._last_plot_s = 0.0
        self._build_widgets(models, steps, seed, target_accuracy)
        self._on_model_change()
        self.batch_size.value = self._nearest_option(batch_size)

    # ------------------------------------------------------------------ widgets
    def _build_widgets(self, models, steps, seed, target_accuracy) -> None:
        self.model_name = W.Dropdown(options=list(models), value=models[0], description="Model")
        self.batch_size = W.SelectionSlider(options=[("1", 1)], description="Batch size", continuous_update=False,
                                            layout=W.Layout(width="420px"))
        self.limit_note = W.HTML("").add_class("labkit-limit")
        self.lr_scaling = W.Checkbox(value=True, description="Linear LR scaling + warm-up", indent=False)
        self.steps = W.IntText(value=steps or pick(fast=30, full=300), description="Steps")
        self.seed = W.IntText(value=seed, description="Seed")
        self.target = W.FloatSlider(value=target_accuracy, min=0.1, max=1.0, step=0.05, description="Target acc")
        self.run_button = W.Button(description="Run", button_style="success")
        self.stop_button = W.Button(description="Stop", button_style="danger", disabled=True)
        self.readout = W.HTML("press Run").add_class("labkit-readout")
        self.status = W.HTML("").add_class("labkit-status")
        self.memory_view = W.HTML(memory_bars_html([], None))
        self.curves_view = W.Image(format="png")
        self.results_view = W.HTML("").add_class("labkit-results")
        self.run_button.on_click(lambda _: self.run(blocking=False))
        self.stop_button.on_click(lambda _: self.stop())
        self.model_name.observe(lambda _: self._on_model_change(), names="value")
        self.batch_size.observe(lambda _: self._show_verdict(), names="value")
        self.target.observe(lambda _: self._refresh_views(force=True), names="value")
        controls = W.HBox([W.VBox([self.model_name, self.batch_size, self.limit_note]),
                           W.VBox([self.steps, self.seed, self.target, self.lr_scaling]),
                           W.VBox([self.run_button, self.stop_button])])
        self.widget = W.VBox([controls, self.readout, self.status, self.memory_view, self.curves_view,
                              self.results_view])
        self.widget.add_class("labkit-dashboard")

    def data(self) -> ImageData:
        """The dataset (loaded on first use: digits offline, CIFAR-10 when available)."""
        if self._data is None:
            self._data = load_data(train_limit=pick(fast=512, full=None), val_limit=pick(fast=256, full=None))
        return self._data

    def limit(self, model_name: str | None = None) -> tuple[MemoryModel, BatchLimit]:
        """The kit's memory model and the finder's answer for a model on this device (built once per model)."""
        name = model_name or self.model_name.value
        if name not in self._limits:
            data = self.data()
            net = build_model(name, data.num_classes, data.image_shape).to(self.device)
            run = self.base_run.replace(model=name)
            mem = run.memory_model(net, data.image_shape)
            self._limits[name] = mem, batch_limit(net, run, mem, data.image_shape, device=self.device,
                                                  cpu_budget_bytes=self.budget_bytes, dataset_size=len(data.train),
                                                  safety_margin=self.safety_margin)
        return self._limits[name]

    def knee(self, model_name: str) -> int | None:
        """The knee of this model's own runs here (3+ batch sizes), else the one given (e.g. from a sweep)."""
        return knee_of_runs(self.history, model_name) or self.knees.get(model_name)

    def _on_model_change(self) -> None:
        """New model: rebuild the slider's powers of two up to (and one past) what fits, marks named."""
        name = self.model_name.value
        _, lim = self.limit(name)
        old = self.batch_size.value
        self.batch_size.options = slider_labels(power_of_two_batches(lim), lim, self.knee(name))
        self.batch_size.value = self._nearest_option(old)
        knee = self.knee(name)
        self.limit_note.value = (f'<span style="font-size:11px">fits up to batch <b>{lim.max_batch}</b> '
                                 f'({html.escape(lim.summary)})' + (f"; knee at {knee}" if knee else "") + "</span>")
        self._show_verdict()

    def _nearest_option(self, batch: int) -> int:
        values = [v for _, v in self.batch_size.options]
        return min(values, key=lambda v: (abs(v - batch), v))

    def _show_verdict(self) -> None:
        mem, lim = self.limit()
        verdict = fit_verdict(mem, self.batch_size.value, lim)
        if verdict:
            self.status.value = f'<span style="color:#c44e52"><b>will not run:</b> {html.escape(verdict)}</span>'
        elif not self.running:
            self.status.value = ""

    # ------------------------------------------------------------------ control
    @property
    def running(self) -> bool:
        """True while a run's thread is working."""
        return not self._idle.is_set()

    def run(self, blocking: bool = True) -> DashboardRun | None:
        """Start a run with the current widget values; ``blocking=True`` waits for it and returns it."""
        with self._lock:
            if self.running:
                self.status.value = ('<span style="color:#c44e52"><b>a run is already going:</b> wait for it or '
                                     'press Stop, then Run again</span>')
                return None
            pressed_s = now_s()
            self._stop.clear()
            self.stop_button.disabled = False     # Run stays pressable: a second press is refused with a message
            self._idle.clear()
            threading.Thread(target=self._run_safely, args=(pressed_s,), daemon=True, name="labkit-dashboard").start()
        if blocking:
            try:
                self.wait()
            except BaseException:   # Ctrl-C in the waiting cell: stop the training here, not ~100 steps later
                self._stop_now()
                raise
            return self.history[-1] if self.history else None
        return None

    def _stop_now(self) -> None:
        """Stop the run and wait for its thread: nothing updates the widgets after the cell ended."""
        self.stop()
        self.wait(timeout_s=120)
        if self.history and self.history[-1].result is None and not self.history[-1].error:
            self.history[-1].error = "interrupted before its first step"

    def stop(self) -> None:
        """Ask the running training to stop after its current step."""
        self._stop.set()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the current run has finished."""
        self._idle.wait(timeout_s)

    # ------------------------------------------------------------------ the run (background thread)
    def _run_safely(self, pressed_s: float) -> None:
        try:
            self._train_once(pressed_s)
        except Exception as err:  # noqa: BLE001 - shown in the panel, never a silent dead thread
            self.status.value = (f'<span style="color:#c44e52"><b>{type(err).__name__}:</b> '
                                 f'{html.escape(str(err))}</span>')
            if self.history and self.history[-1].result is None:
                self.history[-1].error = str(err)
        finally:
            self.stop_button.disabled = True
            self._idle.set()

    def _new_run(self, pressed_s: float) -> tuple[DashboardRun, MemoryModel]:
        """Check the widget values once (a RunSpec), refuse a batch that would not fit, scale the LR (Goyal 2017)."""
        data = self.data()
        steps = positive_int(self.steps.value, "Steps")
        spec = self.base_run.replace(model=self.model_name.value, batch_size=self.batch_size.value,
                                     seed=self.seed.value, dataset_size=len(data.train))
        mem, lim = self.limit()
        verdict = fit_verdict(mem, spec.batch_size, lim)
        if verdict:
            raise ValueError(verdict)
        bs, rule = spec.batch_size, "same lr"
        if self.lr_scaling.value:
            spec = spec.replace(lr=scaled_lr(self.base_lr, bs, self.base_batch), lr_warmup_steps=5)
            rule = f"linear x{bs}/{self.base_batch} + warm-up"
        return DashboardRun(spec, steps, rule, memory=mem.predict(bs), limit=lim, started_s=pressed_s), mem

    def _train_once(self, pressed_s: float) -> None:
        run, _ = self._new_run(pressed_s)
        self.history.append(run)
        if not ONE_TRAINING_AT_A_TIME.acquire(blocking=False):
            self.status.value = (f"waiting: another dashboard in this kernel is training; {run.label} starts when it "
                                 "ends (runs share torch's random generator and cuDNN settings, so side by side the "
                                 "same seed would not give the same run)")
            ONE_TRAINING_AT_A_TIME.acquire()
        try:
            self._train_alone(run)
        finally:
            ONE_TRAINING_AT_A_TIME.release()

    def _train_alone(self, run: DashboardRun) -> None:
        data = self.data()
        self._last_plot_s = 0.0                 # a new run plots its first point at once
        self.status.value = f"running {run.label}, lr {run.lr:.4g}, seed {run.seed} ..."
        with deterministic_kernels():        # seeded and deterministic: the same settings give the same run
            seed_everything(run.seed)        # the weights too: repeats of the same settings start alike
            model = build_model(run.model, data.num_classes, data.image_shape)
            baseline = cuda_baseline_bytes()
            cfg = TrainConfig(run=run.spec, steps=run.total_steps, device=str(self.device), progress=False,
                              warmup_steps=min(2, run.total_steps - 1), profile_model=False)
            result = train(model, run.spec.loader(data.train), cfg,
                           val_loader=make_loader(data.val, min(len(data.val), 256)),
                           callback=lambda rec, progress: self._on_step(run, rec, progress, baseline))
            run.result, run.stopped = result, result.stopped_early
            if result.val_accuracy is not None:
                run.add_accuracy(result.val_accuracy)
            if self.ceiling_steps and not run.stopped:
                self.status.value = f"measuring the device-resident ceiling of {run.label} ..."
                run.ceiling_samples_per_s = self._ceiling(model, run, cfg)
        self._refresh_views(run, force=True)
        word = "stopped" if run.stopped else "finished"
        self.status.value = (f"{word} {run.label} (seed {run.seed}): {result.samples_per_s_median:.1f} samples/s "
                             f"(median), val accuracy {result.val_accuracy:.3f} on {html.escape(result.device)}")
        if run.model == self.model_name.value:
            self._on_model_change()          # the knee of this model's runs may have moved

    def _ceiling(self, model, run: DashboardRun, cfg: TrainConfig) -> float:
        """The same model and recipe on batches resident on the device (:func:`labkit.training.ceiling`)."""
        data = self.data()
        ceil_cfg = TrainConfig(run=run.spec.replace(lr_warmup_steps=0), steps=self.ceiling_steps + cfg.warmup_steps,
                               device=cfg.device, progress=False, warmup_steps=cfg.warmup_steps, profile_model=False)
        best = measure_ceiling(model, run.batch_size, ceil_cfg, image_shape=data.image_shape,
                               num_classes=data.num_classes, repeats=2, sample_from=data.train)
        return best.samples_per_s_median

    def _on_step(self, run: DashboardRun, rec, progress, baseline_bytes: int | None) -> bool:
        """Training-thread callback (gets ``train``'s public TrainProgress): record, refresh, honour Stop."""
        run.add_step(rec.step + 1, rec.samples, rec.step_time_s, rec.samples_per_s, rec.loss)
        n = rec.step + 1
        if run.measured_bytes is None or (baseline_bytes is not None and n == 2):
            run.measured_bytes = measure_run_memory(progress, run.memory, baseline_bytes)
            if baseline_bytes is not None and progress.last_inputs.device.type == "cuda":
                run.reserved_bytes = max(0, _reserved_bytes(progress) - run.measured_bytes - baseline_bytes)
        grid = self.eval_every_samples
        seen = run.points[-1]["samples_seen"]
        if grid and seen // grid > (seen - rec.samples) // grid and n < run.total_steps:   # crossed a grid line
            run.add_accuracy(self._quick_accuracy(progress.model))
        if n == 1 or n % self.update_every == 0 or self._stop.is_set():
            self._refresh_views(run)
        return self._stop.is_set()

    def _quick_accuracy(self, model) -> float:
        val = self.data().val
        sub = Subset(val, range(min(self.eval_samples, len(val))))
        return evaluate_accuracy(model, make_loader(sub, len(sub)))

    def _refresh_views(self, run: DashboardRun | None = None, force: bool = False) -> None:
        """Readout and memory bars now; curves and table at most every PLOT_EVERY_S (always when forced)."""
        run = run or (self.history[-1] if self.history else None)
        if run is None:
            return
        if run.points:
            pts = run.points[-5:]
            sps = statistics.median(p["samples_per_s"] for p in pts)
            ms = statistics.median(p["step_time_ms"] for p in pts)
            peak = (run.measured_bytes or run.memory.total_bytes) / 1e6
            acc = f" · val accuracy {run.final_accuracy:.3f}" if run.accuracy else ""
            self.readout.value = (f"<b>{html.escape(run.label)}</b> · step {run.points[-1]['step']}/{run.total_steps}"
                                  f" · {run.points[-1]['samples_seen']:,} samples seen · {sps:.1f} samples/s"
                                  f" · step time {ms:.1f} ms · peak memory {peak:.1f} MB"
                                  f" · loss {run.points[-1]['loss']:.3f}{acc}")
        self.memory_view.value = memory_bars_html(self.history, run.limit)
        now = now_s()
        if force or now - self._last_plot_s > PLOT_EVERY_S:
            self.curves_view.value = curves_png(self.history, self.target.value)
            self.results_view.value = results_html(self.history, self.target.value)
            self._last_plot_s = now_s()
            if run.started_s is not None and run.points:
                run.update_s.append(self._last_plot_s - run.started_s)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def _reserved_bytes(progress) -> int:
    """Peak bytes the CUDA caching allocator held during the run (GPU only)."""
    return peak_since(progress.last_inputs.device, 0)[1]
