"""Notebook 17's tables, verdicts and figures from the ranks' timing results (:func:`runs.run_overlap_timing`).

A step ends when its slowest rank does, so each round's step time is the largest over the ranks; its exposed
communication is what the last rank out of backward still waits (the smallest wait: the others wait for it too). The
prediction uses the same run's numbers: the all-reduce's alpha-beta fit (the mean over ranks) and when each layer's
backward ended in the step without communication ('none'; median over rounds, latest rank).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from labkit.core.verdict import Load, Rival, Verdict, judge_at_least, judge_at_most, relative_spread
from labkit.parallel.overlap.exposed import (best_cap, bucket_ready_s, describe_cap, overlappable_s,
                                             schedule_buckets)


RIVAL_NO_OVERLAP = "no overlap (exposed = T_comm, the naive sync's wait)"
RIVAL_SIZE_DOES_NOT_MATTER = "bucket size does not matter (1.0x)"


def median_of(results: Sequence[Mapping], variant: str, key: str) -> float:
    """Median over rounds of :func:`per_round`."""
    return statistics.median(per_round(results, variant, key))


def per_round(results: Sequence[Mapping], variant: str, key: str) -> list[float]:
    """Each round's ``key`` for ``variant`` over the ranks: 'step_s' and 'backward_s' the largest (a step ends when
    its slowest rank does); 'wait_s' the smallest, the wait of the rank that finished backward last. A rank that
    finished early also waits for its peer's backward, which is skew between ranks, not communication."""
    pick = min if key == "wait_s" else max
    rounds = len(results[0]["rounds"][variant])
    return [pick(r["rounds"][variant][i][key] for r in results) for i in range(rounds)]


def alpha_beta(results: Sequence[Mapping]) -> tuple[float, float]:
    """(alpha s, beta s/byte) of the all-reduce, the mean of the ranks' fits."""
    return (statistics.mean(r["fit"]["alpha_s"] for r in results),
            statistics.mean(r["fit"]["beta_s_per_byte"] for r in results))


def layer_ends_s(results: Sequence[Mapping], variant: str = "none") -> dict[str, float]:
    """When each layer's backward ended, from backward's start: median over rounds, then the latest rank."""
    ends: dict[str, float] = {}
    for r in results:
        by_layer: dict[str, list[float]] = {}
        for step in r["rounds"][variant]:
            for name, _start, end in step["layers"]:
                by_layer.setdefault(name, []).append(end)
        for name, values in by_layer.items():
            ends[name] = max(ends.get(name, 0.0), statistics.median(values))
    return ends


def caps_of(results: Sequence[Mapping]) -> list[float]:
    """The swept bucket caps, in sweep order."""
    return [float(n.removeprefix("cap=")) for n in results[0]["rounds"] if n.startswith("cap=")]


def predicted_sweep(results: Sequence[Mapping]) -> dict[float, dict[str, float]]:
    """Per bucket cap: predicted all-reduce time, overlappable time and exposed time (bucket schedule model)."""
    alpha, beta = alpha_beta(results)
    ends = layer_ends_s(results)
    backward = max(statistics.median(s["backward_s"] for s in r["rounds"]["none"]) for r in results)  # as the ends
    out = {}
    for cap in caps_of(results):
        name = variant_of(results, cap)
        layers = results[0]["bucket_layers"][name]
        ready = bucket_ready_s(layers, ends)
        nbytes = [b[1] for b in results[0]["rounds"][name][0]["buckets"]]
        sched = schedule_buckets(sorted(ready), nbytes, backward, alpha, beta)
        out[cap] = {"comm_s": sched.comm_s, "overlappable_s": overlappable_s(ready, backward),
                    "exposed_s": sched.exposed_s, "buckets": len(nbytes)}
    return out


def variant_of(results: Sequence[Mapping], cap: float) -> str:
    """The variant name ('cap=1048576', 'cap=inf') the ranks timed for bucket cap ``cap``."""
    for name in results[0]["rounds"]:
        if name.startswith("cap=") and float(name.removeprefix("cap=")) == cap:
            return name
    raise KeyError(f"no variant for bucket cap {cap}")


def sweep_rows(results: Sequence[Mapping]) -> list[dict]:
    """One row per bucket cap: buckets, predicted comm / exposed, measured wait (exposed) and step, in ms."""
    predicted = predicted_sweep(results)
    rows = []
    for cap, pred in predicted.items():
        name = variant_of(results, cap)
        rows.append({"bucket cap": describe_cap(cap), "cap_bytes": cap, "buckets": pred["buckets"],
                     "predicted comm ms": 1e3 * pred["comm_s"], "predicted exposed ms": 1e3 * pred["exposed_s"],
                     "measured exposed ms": 1e3 * statistics.median(per_round(results, name, "wait_s")),
                     "measured step ms": 1e3 * statistics.median(per_round(results, name, "step_s"))})
    return rows


def predicted_best_cap(results: Sequence[Mapping]) -> float:
    """The cap the model predicts exposes the least (the smallest among ties)."""
    return best_cap({cap: p["exposed_s"] for cap, p in predicted_sweep(results).items()})


def measured_best_cap(results: Sequence[Mapping]) -> float:
    """The cap whose median measured wait before the update was the least."""
    return best_cap({cap: statistics.median(per_round(results, variant_of(results, cap), "wait_s"))
                     for cap in caps_of(results)})


def _load(results: Sequence[Mapping], ratios: Sequence[float]) -> Load:
    return Load.of_ranks(results, spread=relative_spread(ratios))


def hidden_verdict(results: Sequence[Mapping], cap: float, claim: str) -> Verdict:
    """Bucketed overlap at ``cap`` against the rival 'no overlap' (exposed = T_comm, the naive sync's wait): the
    measured exposed time must sit nearer the model's prediction than the rival, i.e. at most the midpoint."""
    pred = predicted_sweep(results)[cap]
    hidden_fraction = 1.0 - pred["exposed_s"] / pred["comm_s"] if pred["comm_s"] > 0 else 0.0
    bound = 1.0 - hidden_fraction / 2            # midpoint of the model's exposed share and the rival's 1.0
    waits = per_round(results, variant_of(results, cap), "wait_s")
    comm = per_round(results, "naive", "wait_s")
    pairs = [(w, bound * c) for w, c in zip(waits, comm) if w > 0 and c > 0]
    ratios = [w / c for w, c in pairs]
    return judge_at_most(claim, statistics.median(waits) * 1e3, bound * statistics.median(comm) * 1e3,
                         load=_load(results, ratios), unit=" ms", by_round=pairs,
                         rival=Rival(RIVAL_NO_OVERLAP, statistics.median(comm) * 1e3))


def one_bucket_verdict(results: Sequence[Mapping], cap: float, claim: str) -> Verdict:
    """One huge bucket against ``cap``: step(one bucket) / step(cap) at least the midpoint of the rival's 1.0
    (bucket size does not matter) and the model's ratio (backward without communication plus each exposed time)."""
    pred = predicted_sweep(results)
    none_step = statistics.median(per_round(results, "none", "step_s"))
    predicted = (none_step + pred[math.inf]["exposed_s"]) / (none_step + pred[cap]["exposed_s"])
    threshold = (1.0 + predicted) / 2
    big, best = (per_round(results, variant_of(results, c), "step_s") for c in (math.inf, cap))
    ratios = [b / s for b, s in zip(big, best)]
    return judge_at_least(claim, statistics.median(ratios), threshold, load=_load(results, ratios),
                          by_round=[(r, threshold) for r in ratios], rival=Rival(RIVAL_SIZE_DOES_NOT_MATTER, 1.0))


def plot_timeline(result: Mapping, variant: str, ax: Any = None) -> Any:
    """One rank's last round of ``variant``: each layer's backward (top lane) and each bucket's all-reduce from
    launch to finish (one lane per bucket), in ms from backward's start."""
    import matplotlib.pyplot as plt  # lazy: plotting only in the notebook, never on the ranks

    step = result["rounds"][variant][-1]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    for i, (name, start, end) in enumerate(step["layers"]):
        ax.barh(0, 1e3 * (end - start), left=1e3 * start, color=f"C{i % 2}", edgecolor="k", height=0.6)
        ax.text(1e3 * (start + end) / 2, 0, name, ha="center", va="center", fontsize=7)
    for k, (_b, nbytes, launch_s, finish_s) in enumerate(step["buckets"]):
        ax.barh(1 + k, 1e3 * (finish_s - launch_s), left=1e3 * launch_s, color="C3", alpha=0.7, height=0.6)
    ax.axvline(1e3 * step["backward_s"], color="k", ls="--", lw=1, label="backward ends")
    ax.set_yticks(range(1 + len(step["buckets"])),
                  ["backward"] + [f"bucket {b} ({n / 2**20:.1f} MiB)" for b, n, _, _ in step["buckets"]])
    ax.set_xlabel("ms from the start of backward")
    label = describe_cap(float(variant.removeprefix("cap="))) + " buckets" if variant.startswith("cap=") else variant
    ax.set_title(f"rank {result['rank']}, {label}: each layer's backward and each bucket's all-reduce")
    ax.legend(loc="lower right", fontsize=8)
    return ax


def plot_sweep(rows: Sequence[Mapping], ax: Any = None) -> Any:
    """Predicted and measured exposed time per bucket cap."""
    import matplotlib.pyplot as plt  # lazy: plotting only in the notebook, never on the ranks

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(rows))
    ax.plot(xs, [r["predicted exposed ms"] for r in rows], "o--", label="predicted (alpha-beta + backward)")
    ax.plot(xs, [r["measured exposed ms"] for r in rows], "s-", label="measured (wait before the update)")
    ax.plot(xs, [r["predicted comm ms"] for r in rows], ":", color="grey", label="all-reduce time (no overlap)")
    ax.set_xticks(list(xs), [r["bucket cap"] for r in rows], rotation=20)
    ax.set_ylabel("exposed communication (ms)")
    ax.set_xlabel("bucket cap")
    ax.legend(fontsize=8)
    return ax
