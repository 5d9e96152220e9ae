"""What the planner is asked to choose on this machine: this machine's specs measured by the ranks (the "peak" a
bare matmul's rate, the efficiency the unsplit stack's compute-only step at each data-parallel share, alpha and
beta an all-reduce fit per tier), the planner's ranking within the space the runner can execute, and the runs
picked from it: its top three plus the predicted worst and a middle one, so the ranking is tested at both ends,
and the best-ranked layout of every axis none of those uses (tp, pp, cp, ZeRO-2, ZeRO-3), so the self-score covers
every axis it predicts.
"""
from __future__ import annotations

import statistics
from typing import Callable

from labkit.comm.two_tier import Link
from labkit.plan.planner import Prediction, Space, predict, enumerate_layouts
from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout, ModelSpec

TOP = 3
AXES = ("dp", "tp", "pp", "cp", "zero2", "zero3")      # what a scored layout can use, as the score's table names it


def layout_axes(layout: Layout) -> tuple[str, ...]:
    """The axes ``layout`` splits over (degree > 1), in :data:`AXES` order; its data axis is 'dp' when replicated
    (gradients all-reduced) and 'zero2' / 'zero3' when ZeRO shards it, so each is scored on its own."""
    used = {"dp": layout.dp > 1 and not layout.zero, "tp": layout.tp > 1, "pp": layout.pp > 1, "cp": layout.cp > 1,
            "zero2": layout.zero == 2, "zero3": layout.zero == 3}
    return tuple(a for a in AXES if used[a])


def compute_share(layout: Layout) -> int:
    """How many ways the stack's compute is shared without tensor parallelism: dp x pp x cp (each rank runs
    1/(dp pp cp) of the unsplit work), the share whose compute-only step measures this layout's efficiency."""
    return layout.dp * layout.pp * layout.cp


def machine_specs(results: list[dict], cfg: object, share: int) -> tuple[ModelSpec, DeviceSpec, ClusterSpec]:
    """The stack (``cfg``: a ScoreConfig), this device (peak and efficiency measured at 1/``share`` of the unsplit
    work: :func:`compute_share`) and the fitted link, as planner input."""
    model = ModelSpec(cfg.layers, cfg.d_model, cfg.heads, cfg.seq_len, vocab=1,  # type: ignore[attr-defined]
                      global_batch=cfg.global_batch,  # type: ignore[attr-defined]
                      name=f"{cfg.layers} x d{cfg.d_model} stack", embedding=False)  # type: ignore[attr-defined]
    peak = statistics.median(r["matmul_flops_per_s"] for r in results)
    compute_s = max(r["compute_only_s"][str(share)] for r in results)
    efficiency = min(1.0, model.step_flops() / share / (compute_s * peak))
    device = DeviceSpec("this CPU (measured)", 64 * 2**30, peak, efficiency, param_bytes=4,
                        optimizer_bytes_per_param=8)
    intra, inter = (Link(statistics.median(r["link"][tier]["alpha_s"] for r in results),
                         statistics.median(r["link"][tier]["beta_s_per_byte"] for r in results))
                    for tier in ("intra", "inter"))
    per_node = int(results[0]["per_node"])
    return model, device, ClusterSpec(per_node, len(results) // per_node, intra=intra, inter=inter)


def rank_runnable(results: list[dict], cfg: object, space: Space,
                  runs: Callable[[Layout], bool] | None = None) -> list[Prediction]:
    """The planner's step-time ranking of every layout within ``space`` (and, given ``runs``, that the runner
    executes), on the measured specs (each layout's efficiency at its own compute share), fastest first."""
    model, _, cluster = machine_specs(results, cfg, 1)
    sizes = tuple(d for d in range(1, model.global_batch + 1) if model.global_batch % d == 0)
    preds = [predict(*machine_specs(results, cfg, compute_share(lay)), lay)
             for lay in enumerate_layouts(model, cluster, micro_batches=sizes, space=space)
             if runs is None or runs(lay)]
    if not preds:
        raise ValueError(f"no layout of {cluster.world_size} ranks within {space.describe()} splits {model.name}")
    return sorted(preds, key=lambda p: (p.step_s, p.memory_bytes))


def pick_runs(ranked: list, top: int = TOP, others: int = 2) -> list[int]:
    """Positions in ``ranked`` to run: the top ``top``, then the worst and ones evenly spaced from it towards the
    top (with two others: the worst and a middle one); all when there are no more than top + others."""
    n = len(ranked)
    if n <= top + others:
        return list(range(n))
    rest = list(range(top, n))
    step = (len(rest) - 1) / others                 # from the worst towards the top, evenly
    chosen = sorted({rest[-1 - round(i * step)] for i in range(others)})
    return list(range(top)) + chosen


def cover_axes(ranked: list[Prediction], picked: list[int]) -> list[int]:
    """``picked`` plus, for each axis of :data:`AXES` no picked layout uses, the best-ranked layout that uses it."""
    out = list(picked)
    for axis in AXES:
        if not any(axis in layout_axes(ranked[i].layout) for i in out):
            out += [i for i, p in enumerate(ranked) if axis in layout_axes(p.layout)][:1]
    return sorted(out)
