"""The planner scores itself: its predictions for the layouts :mod:`labkit.plan.score_runs` ran, beside what the
ranks measured, with the error, and two judged claims.

The device and the link are this machine's, measured in the same run: the "peak" is a bare matmul's rate, the
efficiency the unsplit stack's compute-only step at each data-parallel share, alpha and beta the all-reduce fit.
One layer's activations are counted on the unsplit layer (:class:`labkit.parallel.tensor.cost.SavedBytes`: the norm
region stays whole under tensor parallelism, the rest is split t ways). Claims: the measured fastest layout is among
the planner's top three (NOT CHECKED when the measured margin is too thin to name a winner, INCONCLUSIVE when the
ranks were too starved), and memory per rank within a stated band.
"""
from __future__ import annotations

import statistics

from labkit.core.clock import paired_median
from labkit.core.verdict import (BUSY_SHARE, CHECKED, FAILED, INCONCLUSIVE, LOAD, NOT_CHECKED, SPREAD, Load,
                                 Verdict, relative_spread)
from labkit.parallel.tensor.megatron import build_block
from labkit.parallel.tensor.cost import SavedBytes
from labkit.parallel.tensor.runs import layer_inputs
from labkit.plan.planner import Prediction, predict
from labkit.plan.runnable import TOP, machine_specs
from labkit.plan.score_runs import ScoreConfig
from labkit.plan.specs import Layout

STATE_BAND = 0.05          # parameters + gradients + optimizer state: counted, so within 5%
ACTIVATION_BAND = 0.35     # saved activations: the layer count misses the stack's hand-offs between layers
CLEAR_MARGIN = 1.15        # the measured winner must beat the next layout by this (paired) to count as clear


def layer_regions(cfg: ScoreConfig, micro_batch: int) -> dict[str, int]:
    """Bytes one unsplit layer saves at ``micro_batch`` sequences: {'norm': ..., 'split': ...}."""
    block = build_block(cfg.shape(micro_batch))
    saved = SavedBytes(block, [block.ln1, block.ln2])
    with saved.recording():
        block(layer_inputs(cfg.shape(micro_batch))[0])
    return saved.totals()


def predictions(results: list[dict], cfg: ScoreConfig, layouts: list[Layout]) -> list[Prediction]:
    """The planner's prediction of each layout run, on this machine's measured specs."""
    out = []
    for lay in layouts:
        model, device, cluster = machine_specs(results, cfg, lay.dp)
        regions = layer_regions(cfg, lay.micro_batch)
        per_layer = regions["norm"] + regions["split"] / lay.tp
        out.append(predict(model, device, cluster, lay, layer_bytes=per_layer,
                           layer_input_bytes=4 * lay.micro_batch * cfg.seq_len * cfg.d_model))
    return out


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
    """Per layout: predicted rank (in the planner's ranking of the space it chose from), step ms and memory MiB (model state, activations) beside measured, with errors."""
    by_step = sorted(preds, key=lambda p: p.step_s)
    ranking = results[0].get("ranking") or [p.layout.label() for p in by_step]   # the planner's, when it chose
    rows = []
    for p in preds:
        name = p.layout.label()
        mem = max((r["memory"][name] for r in results), key=lambda m: m["params"] + m["grads"] + m["optimizer"])
        state = mem["params"] + mem["grads"] + mem["optimizer"]
        pred_state = p.memory["parameters"] + p.memory["gradients"] + p.memory["optimizer state"]
        measured_ms = 1e3 * statistics.median(_slowest(results, name))
        rows.append({"layout": name, "predicted rank": ranking.index(name) + 1, "predicted ms": 1e3 * p.step_s,
                     "measured ms": measured_ms, "step error": measured_ms / (1e3 * p.step_s) - 1,
                     "predicted state MiB": pred_state / 2**20, "measured state MiB": state / 2**20,
                     "state error": state / pred_state - 1,
                     "predicted activations MiB": p.memory["activations kept"] / 2**20,
                     "measured activations MiB": mem["activations"] / 2**20,
                     "activation error": mem["activations"] / p.memory["activations kept"] - 1})
    return rows


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
    if not top or not rest:
        return Verdict(claim, NOT_CHECKED, f"the runs need layouts inside and outside the top {TOP} to compare")
    inside, outside = _slowest(results, top[0]["layout"]), _slowest(results, rest[0]["layout"])
    margin = paired_median(outside, inside)                     # > 1: the planner's top three won
    load = Load.of_ranks(results, spread=relative_spread([a / b for a, b in zip(outside, inside)]))
    winner = top[0] if margin >= 1 else rest[0]
    detail = (f"measured fastest {winner['layout']} (predicted rank {winner['predicted rank']}); best of the top "
              f"{TOP}, {top[0]['layout']}, is {margin:.2f}x the speed of the best other, {rest[0]['layout']}")
    if margin >= CLEAR_MARGIN:
        return Verdict(claim, CHECKED, detail)
    if load.busy:
        return Verdict(claim, INCONCLUSIVE, f"{detail}; {load.reason()}",
                       kind=LOAD if load.worst_share < BUSY_SHARE else SPREAD)
    if margin > 1 / CLEAR_MARGIN:           # quiet, and no clear winner happened: nothing to check (not the load)
        return Verdict(claim, NOT_CHECKED, f"{detail}; no clear winner on this run (margin under {CLEAR_MARGIN}x "
                                           "either way)")
    return Verdict(claim, FAILED, f"{detail}, on a quiet machine, with a clear margin")
