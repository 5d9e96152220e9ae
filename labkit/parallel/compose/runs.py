"""The compositions run on 4 real ranks, each checked against one process, and the bytes per axis against a formula.

Formulas, bytes one rank sends per step, ring convention (Patarasuk & Yuan 2009), float32, L layers on this rank:
- tp: 4 all-reduces per layer over this rank's activations, b_local x s_local x h (Narayanan et al. 2021, SC21,
  arXiv:2104.04473, Section 3.3; :func:`labkit.parallel.tensor.cost.tp_bytes_per_layer`); 6 on pipeline stage 0,
  which recomputes its forward;
- dp (or dp x cp): one all-reduce of this rank's gradients, 2(d-1)/d x P_local; FSDP2 (root only, so no re-gather
  in backward) an all-gather plus a reduce-scatter, (d-1)/d x P_local each (:mod:`labkit.sharding.comm_volume`);
- pp: each stage sends its whole dp share of activations (stage 0) or their gradients (stage 1), b_local x s x h;
- cp: the K/V block (2 x b x s/c x h/t) passed 3c - 2 times per layer (:mod:`labkit.parallel.compose.ring`).
P_local per layer is 6h + (12h^2 + 7h)/t: norms and row biases whole, the rest split over tp.
"""
from __future__ import annotations

from dataclasses import asdict

import torch

from labkit.comm.launch import launch
from labkit.comm.mesh import Mesh
from labkit.parallel.compose.model import StackShape, assemble_grads, reference_step, replicas_agree
from labkit.parallel.compose.steps import COMPOSITIONS, compose_job, grad_axis
from labkit.parallel.tensor.cost import ALL_REDUCES_PER_LAYER, tp_bytes_per_layer
from labkit.sharding.comm_volume import predicted_bytes_per_step

FLOAT_BYTES = 4
# float32, two layers, reductions in another order than one process's: errors of a few ulp (eps 1.2e-7) of the
# largest gradient, ~1e-7 relative measured; 1e-5 leaves room for bigger shapes and stays 10^4 below the rivals
# (a gradient not averaged over dp, a missing tp all-reduce), which are off by tens of percent or more.
GRAD_RTOL = 1e-5
GRAD_ATOL_OF_MAX = 1e-5
LOSS_RTOL = 1e-5
# The hand-written GPipe's stage 0 re-runs its forward in backward (re-materialisation), and with it tp's two
# forward all-reduces per layer: 6 a layer there, not 4 (Korthikanti et al. 2022, arXiv:2205.05198, Section 5).
RECOMPUTED_TP_ALL_REDUCES = 2


def local_params(shape: StackShape, tp: int) -> int:
    """Parameters one rank holds of one layer under tp: 6h whole (two norms, two row biases), 12h^2 + 7h split."""
    h = shape.d_model
    return 6 * h + (12 * h * h + 7 * h) // tp


def predicted_bytes(name: str, shape: StackShape, stage: int = 0) -> dict[str, float]:
    """Bytes a rank of pipeline stage ``stage`` sends per step on each axis of composition ``name`` (stage 0, the
    busiest, by default), from the formulas above."""
    mesh, kind = COMPOSITIONS[name]
    h, layers = shape.d_model, shape.layers // mesh.pp
    b, s = shape.batch // mesh.dp, shape.seq_len // mesh.cp
    out: dict[str, float] = {}
    if mesh.tp > 1:
        rerun = RECOMPUTED_TP_ALL_REDUCES if (mesh.pp > 1 and stage == 0) else 0
        out["tp"] = layers * tp_bytes_per_layer(b, s, h, mesh.tp) * (ALL_REDUCES_PER_LAYER + rerun) / ALL_REDUCES_PER_LAYER
    grads = grad_axis(mesh)
    reducers = mesh.dp * mesh.cp
    if reducers > 1:
        p_bytes = layers * local_params(shape, mesh.tp) * FLOAT_BYTES
        out[grads] = predicted_bytes_per_step("zero2" if kind == "fsdp_tensor" else "ddp", p_bytes, reducers)
    if mesh.pp > 1:
        out["pp"] = float(b * s * h * FLOAT_BYTES)
    if mesh.cp > 1:
        kv_bytes = 2 * b * s * (h // mesh.tp) * FLOAT_BYTES
        out["cp"] = float(layers * (3 * mesh.cp - 2) * kv_bytes)
    return out


def rival_bytes(name: str, shape: StackShape) -> dict[str, tuple[float, str]]:
    """Per axis, the plausible wrong figure (and why): the axis costed as if the other axes did not split its
    tensors (tp on the whole batch or sequence; dp on the whole model; cp on every head), or, where nothing else
    splits them, the optimisation this code does not do (pp: Megatron's scatter/gather, 1/t; FSDP2: ZeRO-3)."""
    mesh, kind = COMPOSITIONS[name]
    alone = _alone(shape, mesh)
    rivals = {}
    for axis, nbytes in predicted_bytes(name, shape).items():
        if axis == "pp" and mesh.tp > 1:
            rivals[axis] = (nbytes / mesh.tp, "Megatron's scatter/gather sends 1/t of the activation per tp rank")
        elif axis == "pp":
            rivals[axis] = (nbytes * mesh.dp, "the whole batch's activations, as if pp ran without dp")
        elif kind == "fsdp_tensor" and axis == "dp":
            rivals[axis] = (nbytes * 1.5, "ZeRO-3's re-gather in backward (1.5x)")
        else:
            rivals[axis] = (alone[axis], "the axis costed on the unsplit tensors, as if it ran alone")
    return rivals


def _alone(shape: StackShape, mesh: Mesh) -> dict[str, float]:
    h, layers = shape.d_model, shape.layers                 # every layer, the whole batch and sequence
    out = {"tp": layers * tp_bytes_per_layer(shape.batch, shape.seq_len, h, max(mesh.tp, 2))}
    p_bytes = layers * local_params(shape, 1) * FLOAT_BYTES
    for axis in ("dp", "dp_cp"):
        out[axis] = predicted_bytes_per_step("ddp", p_bytes, max(mesh.dp * mesh.cp, 2))
    out["cp"] = float(layers * (3 * mesh.cp - 2) * 2 * shape.batch * (shape.seq_len // mesh.cp) * h * FLOAT_BYTES)
    return out


def run_compositions(shape: StackShape | None = None, names: list[str] | None = None,
                     timeout_s: float = 120.0) -> list[dict[str, dict]]:
    """Every named composition (all by default) on 4 gloo ranks, one launch; per rank, per composition, its result."""
    shape = shape or StackShape.fast()
    names = list(COMPOSITIONS) if names is None else names
    unknown = [n for n in names if n not in COMPOSITIONS]
    if unknown:
        raise ValueError(f"unknown compositions {unknown}: choose from {list(COMPOSITIONS)}")
    for name in names:
        shape.check(COMPOSITIONS[name][0])                 # the mesh's rules, before any process starts
    return launch(compose_job, 4, args=(asdict(shape), names), timeout_s=timeout_s, show_output=False,
                  backend="gloo")


def check_equal(name: str, ranks: list[dict[str, dict]], reference: dict) -> dict:
    """Composition ``name`` against one process: loss and every gradient (put back together) with
    ``torch.testing.assert_close`` at the tolerances above; raises on a mismatch, else returns the errors."""
    mesh = COMPOSITIONS[name][0]
    mine = [r[name] for r in ranks]
    losses = [r["loss"] for r in mine if r["loss"] is not None]
    for loss in losses:
        torch.testing.assert_close(loss, reference["loss"], rtol=LOSS_RTOL, atol=0.0)
    full = assemble_grads(mine, mesh)
    if set(full) != set(reference["grads"]):
        raise AssertionError(f"{name}: gradients {sorted(set(full) ^ set(reference['grads']))} missing on one side")
    scale = max(float(g.abs().max()) for g in reference["grads"].values())
    for key, grad in reference["grads"].items():
        torch.testing.assert_close(full[key], grad, rtol=GRAD_RTOL, atol=GRAD_ATOL_OF_MAX * scale,
                                   msg=lambda m, key=key: f"{name}: gradient of {key}: {m}")
    worst = max(float((full[k] - g).abs().max()) for k, g in reference["grads"].items())
    return {"loss": losses[0], "reference_loss": reference["loss"], "max_grad_error": worst,
            "largest_grad": scale, "replica_spread": replicas_agree(mine, mesh)}


def bytes_rows(name: str, ranks: list[dict[str, dict]], shape: StackShape) -> list[dict]:
    """One row per axis: bytes per step the busiest rank sent, the formula, how many ranks' own bytes differ from
    their formula (0 when it holds), the rival and why."""
    predicted, rivals = predicted_bytes(name, shape), rival_bytes(name, shape)
    rows = []
    mesh = COMPOSITIONS[name][0]
    for axis in sorted(predicted, key=["tp", "cp", "pp", "dp", "dp_cp"].index):
        sent = [r[name]["bytes"].get(axis, 0.0) for r in ranks]
        own = [predicted_bytes(name, shape, mesh.coords(rank)["pp"]).get(axis) for rank in range(len(ranks))]
        rows.append({"composition": name, "axis": axis, "measured_bytes": max(sent), "predicted_bytes": predicted[axis],
                     "ranks_off_formula": sum(a != b for a, b in zip(sent, own)),
                     "rival_bytes": rivals[axis][0], "rival": rivals[axis][1]})
    return rows


def summary(shape: StackShape | None = None, names: list[str] | None = None, timeout_s: float = 120.0) -> dict:
    """Run the compositions and check them: {'equal': {name: errors}, 'bytes': rows, 'shape': the stack}."""
    shape = shape or StackShape.fast()
    names = list(COMPOSITIONS) if names is None else names
    ranks, reference = run_compositions(shape, names, timeout_s), reference_step(shape)
    rows = [row for name in names for row in bytes_rows(name, ranks, shape)]
    return {"equal": {name: check_equal(name, ranks, reference) for name in names}, "bytes": rows,
            "shape": shape, "extra_axes": _unpredicted(ranks, names, shape)}


def _unpredicted(ranks: list[dict[str, dict]], names: list[str], shape: StackShape) -> dict[str, float]:
    """Bytes on an axis no formula expected (should be none: a collective on the wrong group shows up here)."""
    out = {}
    for name in names:
        predicted = predicted_bytes(name, shape)
        for r in ranks:
            for axis, nbytes in r[name]["bytes"].items():
                if axis not in predicted and nbytes:
                    out[f"{name}: {axis}"] = max(out.get(f"{name}: {axis}", 0.0), nbytes)
    return out
