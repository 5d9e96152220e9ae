"""Climbing the tuning ladder: measure each rung on top of the best recipe so far, keep what helps.

A rung is carried forward only when it is at least ``min_gain`` faster than the recipe it was added to *and*
its accuracy after the fixed budget stays within ``accuracy_tolerance`` of **rung 0's** (the naive recipe, the
one every speedup is quoted against); every other rung is still reported with the reason it was left out.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass, replace
from typing import Callable

from labkit.core.data import ImageData, load_data, make_loader
from labkit.core.device import device_label, get_device
from labkit.core.env import get_mode, seed_everything
from labkit.core.models import build_model, check_model_accepts
from labkit.core.progress import progress_bar
from labkit.core.threads import matched_threads
from labkit.ladder.capabilities import detect_capabilities
from labkit.ladder.config import LadderConfig, budget_samples
from labkit.ladder.ddp import measure_ddp
from labkit.ladder.first_to_target import TargetPlan, with_time_to_target
from labkit.ladder.measure import (SLOW_RUNG_FRACTION, Measurement, measure_model, mfu_of, rung_run, run_spec,
                                   steps_for_budget, train_config, train_loader)
from labkit.ladder.report import LadderResult, LadderRow
from labkit.ladder.rungs import RUNGS, Capabilities, Recipe, RungSpec, propose
from labkit.training.ceiling import measure_ceiling
from labkit.training.finder import find_max_batch
from labkit.training.flops import fp32_math_of

HARDWARE_RUNGS = ("tf32", "mixed_precision", "channels_last", "compile", "ddp")   # may fail where unsupported
MIN_TIMED_STEPS = 3


@dataclass(frozen=True)
class LadderJob:
    """Everything a rung needs to measure a recipe (built once per ladder)."""

    config: LadderConfig
    model_fn: Callable
    data: object                  # ImageData
    device: str
    caps: Capabilities
    val_loader: object
    budget_samples: int
    trainer: Callable | None = None


def measure_recipe(job: LadderJob, recipe: Recipe, stop_below_sps: float | None = None) -> Measurement:
    """Train a fresh, identically initialised model with ``recipe`` for the fixed budget and measure it
    (``stop_below_sps``: a single-process rung running slower stops early; see ladder.measure.measure_model)."""
    cfg = job.config
    steps = steps_for_budget(job.budget_samples, recipe.global_batch, cfg.warmup_steps + MIN_TIMED_STEPS)
    run = rung_run(recipe, cfg, steps)
    if recipe.world_size > 1:
        return measure_ddp(recipe, run, job.model_fn, job.data, steps=steps, warmup_steps=cfg.warmup_steps,
                           timeout_s=cfg.ddp_timeout_s, threads_per_rank=max(1, job.caps.cpu_cores // recipe.world_size))
    seed_everything(run.seed)
    model = job.model_fn()
    loader = train_loader(job.data.train, recipe, run.seed, job.device)
    return measure_model(model, loader, job.val_loader, recipe, run, steps=steps, warmup_steps=cfg.warmup_steps,
                         device=job.device, trainer=job.trainer, stop_below_sps=stop_below_sps)


def choose_batch_size(job: LadderJob) -> tuple[int, dict[int, float], str]:
    """Rung 1's batch: the candidates that fit (the finder, where it applies), then the fastest in a short probe."""
    cfg = job.config
    n = len(job.data.train)
    fits, note = _finder_filter([b for b in cfg.batch_candidates if b <= n], job)
    if not fits:
        raise ValueError(f"no batch in batch_candidates={cfg.batch_candidates} fits the data ({n} training samples) "
                         "and the memory budget; give smaller batch_candidates")
    rates: dict[int, float] = {}
    for b in fits:
        probe = replace(job, val_loader=None, budget_samples=b * (cfg.warmup_steps + cfg.probe_steps))
        rates[b] = measure_recipe(probe, Recipe(batch_size=b)).samples_per_s
    return max(rates, key=rates.get), rates, note


def _finder_filter(candidates: list[int], job: LadderJob) -> tuple[list[int], str]:
    """Keep the candidates the batch-size finder says fit (GPU: OOM search; CPU: against a memory budget)."""
    if not candidates:
        return candidates, "no candidate fits the data"
    if job.device.startswith("cpu") and job.config.memory_budget_bytes is None:
        return candidates, "no CPU memory budget given, every candidate assumed to fit and measured"
    found = find_max_batch(job.model_fn(), tuple(job.data.image_shape), num_classes=job.data.num_classes,
                           device=job.device, memory_budget_bytes=job.config.memory_budget_bytes,
                           limit=max(candidates), timing_steps=0, run=run_spec(Recipe(), lr=job.config.lr))
    how = "memory model vs the CPU budget" if found.method == "memory-model" else "real steps until out of memory"
    return ([b for b in candidates if b <= found.max_batch],
            f"finder ({how}): largest batch that fits = {found.max_batch}")


def verdict(job: LadderJob, m: Measurement, base_sps: float, base_rung: int,
            ref_acc: float | None) -> tuple[str, str, bool]:
    """(status, reason, kept) of a measured rung: speed against its base recipe, accuracy against rung 0's."""
    cfg = job.config
    x = m.samples_per_s / base_sps
    versus = f"{x:.2f}x the recipe of rung {base_rung}"
    if x < 1.0:
        return "slower", f"{versus} (slower here): not carried forward", False
    if x < 1.0 + cfg.min_gain:
        return "no clear gain", f"{versus}, under the {cfg.min_gain:.0%} bar: not carried forward", False
    if ref_acc is not None and m.val_accuracy is not None and m.val_accuracy < ref_acc - cfg.accuracy_tolerance:
        return "faster", (f"{versus}, but accuracy {m.val_accuracy:.1%} is more than "
                          f"{cfg.accuracy_tolerance:.0%} below rung 0's {ref_acc:.1%}: not carried forward"), False
    return "faster", f"{versus}: carried forward", True


def _row(spec: RungSpec, status: str, reason: str, kept: bool, compared_to: int | None, change: str,
         **numbers) -> LadderRow:
    return LadderRow(spec.index, spec.key, spec.title, change, spec.explanation, spec.notebook, status, reason,
                     kept, compared_to, **numbers)


def _numbers(job: LadderJob, recipe: Recipe, m: Measurement, sps0: float, base_sps: float,
             flops: float | None, ref_acc: float | None) -> dict:
    cfg = job.config
    acc_ok = None if ref_acc is None or m.val_accuracy is None else \
        m.val_accuracy >= ref_acc - cfg.accuracy_tolerance
    return dict(accuracy_ok=acc_ok, recipe=asdict(recipe), batch_size=recipe.batch_size, world_size=recipe.world_size,
                lr=rung_run(recipe, cfg, m.steps).lr, samples_per_s=m.samples_per_s,
                step_time_s=m.step_time_s, peak_mem_bytes=m.peak_mem_bytes, data_wait_fraction=m.data_wait_fraction,
                math_mode=m.math_mode, mfu=mfu_of(flops, m.samples_per_s / recipe.world_size, job.device, m.math_mode),
                val_accuracy=m.val_accuracy, startup_s=m.startup_s, samples_trained=m.samples_trained,
                speedup_cumulative=m.samples_per_s / sps0, speedup_rung=m.samples_per_s / base_sps)


def _attempt(job: LadderJob, spec: RungSpec, recipe: Recipe, base_sps: float) -> tuple[Measurement | None, str]:
    """(measurement, "") or, for a hardware rung that fails here, (None, the error's first line). A rung after the
    first two stops early once it runs under SLOW_RUNG_FRACTION of its base recipe's speed: it cannot be kept."""
    stop_below = base_sps * SLOW_RUNG_FRACTION if spec.key not in ("naive", "batch_size") and base_sps > 0 else None
    try:
        return measure_recipe(job, recipe, stop_below), ""
    except Exception as err:  # noqa: BLE001 - a hardware rung that fails here is reported, not fatal
        if spec.key not in HARDWARE_RUNGS:
            raise
        text = str(err).strip()
        return None, f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def climb(job: LadderJob, on_rung: Callable[[LadderRow], None] | None = None
          ) -> tuple[list[LadderRow], dict[int, float], list[str]]:
    """Measure every rung in order; returns (rows, rung 1's batch probe, notes). ``on_rung`` sees each finished row."""
    cfg = job.config
    rows: list[LadderRow] = []

    def keep(row: LadderRow) -> None:
        rows.append(row)
        if on_rung is not None:
            on_rung(row)

    probe: dict[int, float] = {}
    notes: list[str] = []
    base, base_rung, base_sps, sps0, ref_acc, flops, batch = Recipe(), 0, 0.0, 0.0, None, None, 1
    bar = progress_bar(RUNGS, desc="ladder", unit="rung", enabled=cfg.progress)
    for spec in bar:
        bar.set_postfix_str(spec.title)
        if spec.key in cfg.skip:
            keep(_row(spec, "skipped", "left out by LadderConfig.skip", False, None, ""))
            continue
        if spec.key == "batch_size":
            batch, probe, note = choose_batch_size(job)
            notes.append(f"Rung 1's batch {batch}: fastest in a {cfg.probe_steps}-step probe of {sorted(probe)} "
                         f"({note}); LR {cfg.lr:g} at batch {cfg.lr_ref_batch}, scaled linearly, with a linear "
                         f"warm-up over the first {cfg.lr_warmup_fraction:.0%} of the steps (Goyal et al. 2017).")
        recipe, change = propose(spec.key, base, job.caps, batch)
        if recipe is None:
            keep(_row(spec, "not applicable here", change, False, None, ""))
            continue
        m, why = _attempt(job, spec, recipe, base_sps)
        if m is None:
            keep(_row(spec, "unsupported here", why, False, None, change, recipe=asdict(recipe)))
            continue
        flops = m.flops_per_sample or flops
        if spec.key == "naive":
            sps0 = base_sps = m.samples_per_s
            ref_acc = m.val_accuracy                                   # rung 0: the accuracy reference
        status, reason, kept = ("baseline", "the reference for every speedup and accuracy", True) \
            if spec.key == "naive" else verdict(job, m, base_sps, base_rung, ref_acc)
        if m.stopped_early:
            share = "" if m.stop_cpu_share is None else f" with {m.stop_cpu_share:.2f} of a core"
            reason += (f"; stopped after {m.steps} steps, under {SLOW_RUNG_FRACTION:.0%} of its base's speed{share} "
                       "(accuracy not measured)")
        keep(_row(spec, status, reason, kept, None if spec.key == "naive" else base_rung, change,
                  **_numbers(job, recipe, m, sps0, base_sps, flops, None if spec.key == "naive" else ref_acc)))
        if kept:
            base, base_rung, base_sps = recipe, spec.index, m.samples_per_s
    return rows, probe, notes


def run_ladder(config: LadderConfig | None = None, model_fn: Callable | None = None, data: ImageData | None = None, *,
               trainer: Callable | None = None, ceiling_fn: Callable | None = None,
               on_rung: Callable[[LadderRow], None] | None = None, to_target: TargetPlan | None = None,
               on_phase: Callable[[str], None] | None = None) -> LadderResult:
    """Climb the ladder on one job: measure every rung, carry forward the ones that help, return the table.

    ``model_fn()`` builds a fresh model (default: ``config.model`` via labkit.core.models.build_model; must be picklable,
    e.g. a module-level function, for the DDP rung); ``data`` is an ImageData (default: labkit.core.data.load_data);
    ``trainer`` replaces labkit.training.loop.train and ``ceiling_fn`` labkit.training.ceiling.measure_ceiling
    (tests inject fakes). ``on_rung`` receives each rung's row as it finishes (the CLI saves it at once).
    ``to_target``: then time every rung to that target (:mod:`labkit.ladder.first_to_target`; it trains with the
    kit's own loop, never ``trainer``); ``on_phase`` hears the name of each phase after the rungs as it starts.
    """
    config = config or LadderConfig.for_mode()
    name = config.model if model_fn is None else getattr(model_fn, "__name__", type(model_fn).__name__)
    device = get_device(config.device)
    if data is None:
        data = load_data(config.dataset, train_limit=config.train_limit, val_limit=config.val_limit, seed=config.seed)
    model_fn = model_fn or functools.partial(build_model, config.model, data.num_classes, tuple(data.image_shape))
    check_model_accepts(model_fn(), tuple(data.image_shape), data.num_classes)
    caps = detect_capabilities(device, config.ddp_world_size, config.num_workers)
    ddp_world = caps.ddp_world_size if "ddp" not in config.skip and caps.ddp_world_size >= 2 else 1
    job = LadderJob(config, model_fn, data, str(device), caps, make_loader(data.val, min(256, len(data.val))),
                    budget_samples(config, len(data.train), ddp_world), trainer)
    with matched_threads(device) as threads:      # a busy core: fewer threads, or oneDNN's barriers spin
        rows, probe, notes = climb(job, on_rung)
        result = LadderResult(rows, device_label(device), str(get_mode()), name, data.name, job.budget_samples,
                              probe, [*notes, threads.describe()])
        if config.measure_ceiling:
            if on_phase is not None:
                on_phase("the hardware ceiling")
            result = with_ceiling(result, job, ceiling_fn)
        if to_target is not None:
            if on_phase is not None:
                on_phase("the time to the target")
            result = with_time_to_target(result, config, data, to_target, model_fn=model_fn, device=str(device))
        return result


def with_ceiling(result: LadderResult, job: LadderJob, ceiling_fn: Callable | None = None) -> LadderResult:
    """The result with the hardware ceiling measured for its best single-process recipe, and every rung's
    fraction of it (per process, so a DDP rung is compared per device)."""
    single = [r for r in result.rows if r.measured and r.world_size == 1 and r.accuracy_ok is not False]
    if not single:
        return result
    best = max(single, key=lambda r: r.samples_per_s)
    recipe = Recipe(**best.recipe)
    ceiling_fn = ceiling_fn or measure_ceiling
    cfg = job.config
    steps = steps_for_budget(job.budget_samples, recipe.batch_size, cfg.warmup_steps + MIN_TIMED_STEPS)
    train_cfg = train_config(recipe, run_spec(recipe, lr=best.lr, seed=cfg.seed), steps=steps,
                             warmup_steps=cfg.warmup_steps, device=job.device)
    with fp32_math_of(train_cfg.spec):
        run = ceiling_fn(job.model_fn(), recipe.batch_size, train_cfg, image_shape=tuple(job.data.image_shape),
                         num_classes=job.data.num_classes, sample_from=job.data.train)
    ceiling = float(run.samples_per_s_median)
    rows = [dataclasses.replace(r, fraction_of_ceiling=r.samples_per_s / r.world_size / ceiling)
            if r.measured else r for r in result.rows]
    note = (f"rung {best.rung}'s recipe ({best.math_mode}, batch {recipe.batch_size}) on training batches already "
            f"on the device, {steps} steps, fastest of its repeats")
    return dataclasses.replace(result, rows=rows, ceiling_samples_per_s=ceiling, ceiling_note=note)
