"""What the planner is asked to choose on this machine: this machine's specs measured by the ranks (the "peak" a
bare matmul's rate, the efficiency the unsplit stack's compute-only step at each data-parallel share, alpha and
beta an all-reduce fit per tier), the planner's ranking within the space the runner can execute, and the runs
picked from it: its top three plus the predicted worst and a middle one, so the ranking is tested at both ends.
"""
from __future__ import annotations

import statistics

from labkit.comm.two_tier import Link
from labkit.plan.planner import Prediction, Space, predict, enumerate_layouts
from labkit.plan.specs import ClusterSpec, DeviceSpec, ModelSpec

TOP = 3


def machine_specs(results: list[dict], cfg: object, dp: int) -> tuple[ModelSpec, DeviceSpec, ClusterSpec]:
    """The stack (``cfg``: a ScoreConfig), this device (peak and efficiency measured at the dp share) and the fitted
    link, as planner input."""
    model = ModelSpec(cfg.layers, cfg.d_model, cfg.heads, cfg.seq_len, vocab=1,  # type: ignore[attr-defined]
                      global_batch=cfg.global_batch,  # type: ignore[attr-defined]
                      name=f"{cfg.layers} x d{cfg.d_model} stack", embedding=False)  # type: ignore[attr-defined]
    peak = statistics.median(r["matmul_flops_per_s"] for r in results)
    compute_s = max(r["compute_only_s"][str(dp)] for r in results)
    efficiency = min(1.0, model.step_flops() / dp / (compute_s * peak))
    device = DeviceSpec("this CPU (measured)", 64 * 2**30, peak, efficiency, param_bytes=4,
                        optimizer_bytes_per_param=8)
    intra, inter = (Link(statistics.median(r["link"][tier]["alpha_s"] for r in results),
                         statistics.median(r["link"][tier]["beta_s_per_byte"] for r in results))
                    for tier in ("intra", "inter"))
    per_node = int(results[0]["per_node"])
    return model, device, ClusterSpec(per_node, len(results) // per_node, intra=intra, inter=inter)


def rank_runnable(results: list[dict], cfg: object, space: Space) -> list[Prediction]:
    """The planner's step-time ranking of every layout within ``space``, on the measured specs (each layout's
    efficiency at its own dp share), fastest first."""
    model, _, cluster = machine_specs(results, cfg, 1)
    sizes = tuple(d for d in range(1, model.global_batch + 1) if model.global_batch % d == 0)
    preds = [predict(*machine_specs(results, cfg, lay.dp), lay)
             for lay in enumerate_layouts(model, cluster, micro_batches=sizes, space=space)]
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
