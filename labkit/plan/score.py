"""The planner scores itself: its predictions for the layouts :mod:`labkit.plan.score_runs` ran, beside what the
ranks measured, with the error, and two judged claims.

The device and the link are this machine's, measured in the same run: the "peak" is a bare matmul's rate, the
efficiency the unsplit stack's compute-only step at each data-parallel share, alpha and beta the all-reduce fit.
One layer's activations are counted on the unsplit layer (:class:`labkit.parallel.tensor.cost.SavedBytes`: the norm
region stays whole under tensor parallelism, the rest is split t ways). Claims: the measured fastest layout is among
the planner's top three (NOT CHECKED when the measured margin is too thin to name a winner on a quiet run,
INCONCLUSIVE with its kind when the ranks were starved or noisy enough to explain the miss, failed otherwise), and
memory per rank within a stated band, per axis, each axis's rival memory model rejected (:func:`axis_memory_checks`).
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from labkit.core.clock import paired_median
from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE, NOT_CHECKED, Load, Verdict, relative_spread
from labkit.parallel.tensor.megatron import LayerShape, build_block
from labkit.parallel.tensor.cost import SavedBytes
from labkit.parallel.tensor.runs import layer_inputs
from labkit.plan.planner import Prediction, predict
from labkit.plan.runnable import AXES, TOP, compute_share, layout_axes, machine_specs
from labkit.plan.score_runs import ScoreConfig
from labkit.plan.specs import Layout, memory_terms

STATE_BAND = 0.05          # parameters + gradients + optimizer state: counted, so within 5%
ACTIVATION_BAND = 0.35     # saved activations: the layer count misses the stack's hand-offs between layers
CLEAR_MARGIN = 1.15        # the measured winner must beat the next layout by this (paired) to count as clear


def layer_regions(cfg: ScoreConfig, micro_batch: int, cp: int = 1) -> dict[str, int]:
    """Bytes one unsplit layer saves at ``micro_batch`` sequences of seq_len / ``cp`` tokens (a cp rank's share):
    {'norm': ..., 'split': ...}."""
    shape = LayerShape(cfg.d_model, cfg.heads, cfg.seq_len // cp, micro_batch)
    block = build_block(shape)
    saved = SavedBytes(block, [block.ln1, block.ln2])
    with saved.recording():
        block(layer_inputs(shape)[0])
    return saved.totals()


def predictions(results: list[dict], cfg: ScoreConfig, layouts: list[Layout]) -> list[Prediction]:
    """The planner's prediction of each layout run, on this machine's measured specs (the efficiency at the layout's
    compute share), one layer's activations counted on the unsplit layer at a cp rank's tokens."""
    out = []
    for lay in layouts:
        model, device, cluster = machine_specs(results, cfg, compute_share(lay))
        out.append(predict(model, device, cluster, lay, **_layer_bytes(cfg, lay)))
    return out


def _layer_bytes(cfg: ScoreConfig, lay: Layout, cp: int | None = None) -> dict[str, float]:
    """One layer's saved activations and its input on a rank of ``lay`` (at seq_len / ``cp`` tokens; lay.cp's)."""
    cp = lay.cp if cp is None else cp
    regions = layer_regions(cfg, lay.micro_batch, cp)
    return {"layer_bytes": regions["norm"] + regions["split"] / lay.tp,
            "layer_input_bytes": 4 * lay.micro_batch * cfg.seq_len // cp * cfg.d_model}


def layouts_run(results: list[dict]) -> list[Layout]:
    """The layouts the ranks ran (given, or the planner's picks), in run order."""
    return [Layout(**d) for d in results[0]["layouts"]]


def planner_ranking(results: list[dict]) -> list[dict]:
    """The planner's ranking of the runnable space (made on the specs the ranks measured first), runs marked."""
    ran = {lay.label() for lay in layouts_run(results)}
    return [{"planner rank": i, "layout": name, "run": name in ran}
            for i, name in enumerate(results[0]["ranking"], 1)]


def _slowest(results: list[dict], name: str) -> list[float]:
    return [max(r["seconds"][name][i] for r in results) for i in range(len(results[0]["seconds"][name]))]


def score_rows(results: list[dict], preds: list[Prediction]) -> list[dict]:
    """Per layout: the axes it uses, predicted rank (in the planner's ranking of the space it chose from), step ms
    and memory MiB (model state, activations: each the busiest rank's) beside measured, with errors."""
    by_step = sorted(preds, key=lambda p: p.step_s)
    ranking = results[0].get("ranking") or [p.layout.label() for p in by_step]   # the planner's, when it chose
    rows = []
    for p in preds:
        name = p.layout.label()
        state = max(m["params"] + m["grads"] + m["optimizer"] for m in (r["memory"][name] for r in results))
        activations = max(r["memory"][name]["activations"] for r in results)
        pred_state = p.memory["parameters"] + p.memory["gradients"] + p.memory["optimizer state"]
        measured_ms = 1e3 * statistics.median(_slowest(results, name))
        rows.append({"layout": name, "axes": " ".join(layout_axes(p.layout)) or "single",
                     "predicted rank": ranking.index(name) + 1, "predicted ms": 1e3 * p.step_s,
                     "measured ms": measured_ms, "step error": measured_ms / (1e3 * p.step_s) - 1,
                     "predicted state MiB": pred_state / 2**20, "measured state MiB": state / 2**20,
                     "state error": state / pred_state - 1,
                     "predicted activations MiB": p.memory["activations kept"] / 2**20,
                     "measured activations MiB": activations / 2**20,
                     "activation error": activations / p.memory["activations kept"] - 1})
    return rows


def axis_summary(rows: list[dict]) -> list[dict]:
    """Per axis (:data:`AXES`), over the layouts that use it: how many ran, the median and worst step-time error,
    and the worst model-state and activation errors (signed: measured / predicted - 1)."""
    out = []
    for axis in AXES:
        mine = [r for r in rows if axis in r["axes"].split()]
        if not mine:
            out.append({"axis": axis, "layouts": 0})
            continue
        worst = {k: max((r[k] for r in mine), key=abs) for k in ("step error", "state error", "activation error")}
        out.append({"axis": axis, "layouts": len(mine),
                    "median step error": statistics.median(r["step error"] for r in mine),
                    "worst step error": worst["step error"], "worst state error": worst["state error"],
                    "worst activation error": worst["activation error"]})
    return out


def memory_within_band(rows: list[dict]) -> bool:
    """Every layout's model state within STATE_BAND and its saved activations (checkpointed or not) within
    ACTIVATION_BAND."""
    return all(abs(r["state error"]) <= STATE_BAND for r in rows) and \
        all(abs(r["activation error"]) <= ACTIVATION_BAND for r in rows)


def winner_verdict(results: list[dict], rows: list[dict]) -> Verdict:
    """Is the measured fastest layout among the planner's top three? Decided only where the margin is clear: the
    fastest of the top three against the fastest of the others, paired round by round."""
    top = sorted((r for r in rows if r["predicted rank"] <= TOP), key=lambda r: r["measured ms"])
    rest = sorted((r for r in rows if r["predicted rank"] > TOP), key=lambda r: r["measured ms"])
    claim = f"the measured fastest layout is among the planner's top {TOP}"
    rival = f"a layout outside the planner's top {TOP} is the measured fastest"
    if not top or not rest:
        return Verdict(claim, NOT_CHECKED, f"the runs need layouts inside and outside the top {TOP} to compare")
    inside, outside = _slowest(results, top[0]["layout"]), _slowest(results, rest[0]["layout"])
    margin = paired_median(outside, inside)                     # > 1: the planner's top three won
    load = Load.of_ranks(results, spread=relative_spread([a / b for a, b in zip(outside, inside)]))
    winner = top[0] if margin >= 1 else rest[0]
    detail = (f"measured fastest {winner['layout']} (predicted rank {winner['predicted rank']}); best of the top "
              f"{TOP}, {top[0]['layout']}, is {margin:.2f}x the speed of the best other, {rest[0]['layout']}")
    if margin >= CLEAR_MARGIN:
        return Verdict(claim, CHECKED, detail, rival=rival)
    if load.busy and margin >= 1 / (CLEAR_MARGIN * load.explainable_factor):   # a loss the load can explain
        return Verdict(claim, INCONCLUSIVE, f"{detail}; {load.reason()}",
                       kind=load.kind, rival=rival)
    if not load.busy and margin > 1 / CLEAR_MARGIN:    # quiet, no clear winner: nothing to check (not the load)
        return Verdict(claim, NOT_CHECKED, f"{detail}; no clear winner on this run (margin under {CLEAR_MARGIN}x "
                                           "either way)")
    where = f"; {load.reason()}, which cannot explain a loss this large" if load.busy else ", on a quiet machine"
    return Verdict(claim, FAILED, f"{detail}{where}, with a clear margin", rival=rival)


# Per axis, the plausible wrong memory model the check must reject on the measured numbers, and the figure it moves.
MEMORY_RIVALS = {
    "dp": ("dp shards the model state as ZeRO-3 does (it replicates it)", "state"),
    "tp": ("tp leaves every weight whole on each rank", "state"),
    "pp": ("each pipeline stage holds the whole model", "state"),
    "cp": ("each cp rank keeps the whole sequence's activations", "activations"),
    "zero2": ("ZeRO-2 shards nothing (plain data parallel)", "state"),
    "zero3": ("ZeRO-3 keeps the gathered weights from forward to backward, as ZeRO-2 does", "state"),
}


def _rival_bytes(results: list[dict], cfg: ScoreConfig, lay: Layout, axis: str) -> float:
    """What the rival of ``axis`` predicts for ``lay``: model state or activations, bytes on the busiest rank."""
    changed = {"dp": {"zero": 3}, "tp": {"tp": 1}, "pp": {"pp": 1}, "cp": {}, "zero2": {"zero": 0},
               "zero3": {"zero": 2}}[axis]
    model, device, _ = machine_specs(results, cfg, compute_share(lay))
    terms = memory_terms(model, device, replace(lay, **changed), True,
                         **_layer_bytes(cfg, lay, cp=1 if axis == "cp" else None))
    if MEMORY_RIVALS[axis][1] == "activations":
        return terms["activations kept"]
    return terms["parameters"] + terms["gradients"] + terms["optimizer state"]


def axis_memory_checks(results: list[dict], cfg: ScoreConfig, rows: list[dict]) -> list[dict]:
    """Per axis (:data:`AXES`): the layouts run that use it (:func:`layout_axes`: 'dp' is replicated data parallel),
    whether each one's model state and activations were within STATE_BAND / ACTIVATION_BAND of the prediction, and
    whether the axis's rival (:data:`MEMORY_RIVALS`) fell outside the band on every one of them (rejected)."""
    layouts = {lay.label(): lay for lay in layouts_run(results)}
    out = []
    for axis in AXES:
        mine = [r for r in rows if axis in r["axes"].split()]
        rival, figure = MEMORY_RIVALS[axis]
        band = ACTIVATION_BAND if figure == "activations" else STATE_BAND
        measured = {r["layout"]: r[f"measured {figure} MiB"] * 2**20 for r in mine}
        rival_errors = [measured[r["layout"]] / _rival_bytes(results, cfg, layouts[r["layout"]], axis) - 1
                        for r in mine]
        out.append({"axis": axis, "layouts": len(mine), "within band": bool(mine) and memory_within_band(mine),
                    "rival": rival, "rival moves": figure,
                    "rival error": min(rival_errors, key=abs) if mine else float("nan"),
                    "rival rejected": bool(mine) and all(abs(e) > band for e in rival_errors)})
    return out
