"""Tables of the tensor-parallel runs, one row per (ranks, kind): how exact, what was sent, what each rank holds,
each measured figure beside its prediction. Inputs are ``{world_size: run_tensor_parallel(...)}``.
"""
from __future__ import annotations

from typing import Any

from labkit.parallel.tensor.megatron import LayerShape
from labkit.parallel.tensor.cost import norm_region_bytes, sp_bytes_per_layer, tp_bytes_per_layer

KINDS = {"tp": "TP by hand", "sp": "TP + SP by hand", "dtensor_tp": "TP, parallelize_module",
         "dtensor_sp": "TP + SP, parallelize_module"}
Runs = dict[int, list[dict]]


def exactness_rows(runs: Runs) -> list[dict[str, Any]]:
    """Largest relative gap to the unsplit layer over all ranks: output, input gradient, parameter gradients."""
    return [{"ranks": t, "kind": KINDS[k], **{m: max(r[k][m] for r in ranks) for m in ("out_diff", "x_grad_diff",
                                                                                       "grad_diff")}}
            for t, ranks in sorted(runs.items()) for k in KINDS]


def _calls(phase: dict) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in phase["calls"].items() if n) or "none"


def comm_rows(runs: Runs, shape: LayerShape) -> list[dict[str, Any]]:
    """Per rank and phase, the hand-written layers' collectives: counted, their nominal ring bytes, the bytes this
    rank's process wrote (gloo's sockets; None on NCCL), and the formula's bytes per layer (split evenly)."""
    rows = []
    for t, ranks in sorted(runs.items()):
        formula = {"tp": tp_bytes_per_layer(shape.batch, shape.seq_len, shape.d_model, t),
                   "sp": sp_bytes_per_layer(shape.batch, shape.seq_len, shape.d_model, t)}
        for kind in ("tp", "sp"):
            for phase in ("forward", "backward"):
                p = ranks[0][kind]["phases"][phase]
                wires = [r[kind]["phases"][phase]["wire_bytes"] for r in ranks]
                rows.append({"ranks": t, "kind": KINDS[kind], "phase": phase, "collectives": _calls(p),
                             "nominal_bytes": p["nominal_bytes"], "formula_bytes": formula[kind] / 2,
                             "wire_bytes": None if None in wires else max(wires)})
    return rows


def dtensor_comm_rows(runs: Runs) -> list[dict[str, Any]]:
    """What CommDebugMode counted in torch's layer, beside the hand-written layer's own count."""
    rows = []
    for t, ranks in sorted(runs.items()):
        for hand, api in (("tp", "dtensor_tp"), ("sp", "dtensor_sp")):
            r = ranks[0]
            rows.append({"ranks": t, "kind": KINDS[api], "CommDebugMode forward": r[api]["comm_forward"],
                         "CommDebugMode backward": r[api]["comm_backward"],
                         "by hand forward": _calls(r[hand]["phases"]["forward"]),
                         "by hand backward": _calls(r[hand]["phases"]["backward"])})
    return rows


def memory_rows(runs: Runs, shape: LayerShape) -> list[dict[str, Any]]:
    """Parameters and saved activations per rank: counted, and predicted (matrices / t, the rest whole)."""
    rows = []
    replicated = 6 * shape.d_model                     # two norms' weight and bias, the two row-parallel biases
    for t, ranks in sorted(runs.items()):
        r = max(ranks, key=lambda r: r["sp"]["saved"]["norm"] + r["sp"]["saved"]["split"])
        whole = r["unsplit_saved"]
        for kind, sp in (("tp", False), ("sp", True)):
            rows.append({"ranks": t, "kind": KINDS[kind], "params": r[kind]["params"],
                         "predicted_params": (r["unsplit_params"] - replicated) // t + replicated,
                         "norm_region_bytes": r[kind]["saved"]["norm"],
                         "predicted_norm_bytes": norm_region_bytes(shape.seq_len, shape.batch, shape.d_model, t, sp),
                         "split_blocks_bytes": r[kind]["saved"]["split"], "unsplit_split_over_t": whole["split"] / t})
    return rows
