"""Where tensor parallelism goes: a 2 x 2 mesh (TP x DP) on two emulated nodes of two ranks, placed two ways.

``tp_inside``: each node's two ranks form a TP group, and each DP group pairs one rank of each node, so only the
gradient all-reduce crosses the shaped link. ``dp_inside``: the opposite, so TP's four all-reduces per layer cross
it. The same layer (``labkit.parallel.tensor.megatron``), the same global batch, one training step each through the
kit's one step, timed in interleaved rounds; the bytes over the slow link are read from each node's ``eth0``
counters (as :mod:`labkit.cluster.link_jobs` does). Run under ``labkit launch --nnodes 2`` (:func:`run_placements`).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from labkit.cluster.link_jobs import join_node_group, shape_own_link, timed_placements
from labkit.cluster.linkfit import expected_payload_bytes_s
from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.rankside import Place, job_params, report
from labkit.cluster.run import JobResult, run_job
from labkit.comm.mesh import Mesh, my_group
from labkit.core.step import TrainStep
from labkit.core.validation import positive_number
from labkit.core.verdict import Load, relative_spread
from labkit.parallel.compose.steps import tensor_data_step
from labkit.parallel.tensor.megatron import LayerShape, build_block
from labkit.parallel.tensor.cost import tp_bytes_per_layer
from labkit.parallel.tensor.runs import layer_inputs, probe_loss
from labkit.sharding.comm_volume import ring_bytes_sent

PLACEMENTS = ("tp_inside", "dp_inside")


def mesh_members(placement: str, nodes: int, per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """(TP groups, DP groups) as lists of global ranks (node-major numbering: rank = node * per_node + local).

    One grid, :class:`labkit.comm.mesh.Mesh` with a node's ranks as its fastest axis: ``tp_inside`` gives TP that
    axis (a node's ranks) and DP the other; ``dp_inside``, the deliberately wrong placement, swaps their roles."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    grid = Mesh(dp=nodes, tp=per_node)
    inside, across = grid.members("tp"), grid.members("dp")
    return (inside, across) if placement == "tp_inside" else (across, inside)


def placement_step(me: Place, placement: str, shape: LayerShape) -> TrainStep:
    """This rank's step for ``placement``: the kit's one tp x dp step (its TP part of the layer, its DP share of
    the batch), SGD."""
    nodes = me.world_size // me.local_world_size
    tp_members, dp_members = mesh_members(placement, nodes, me.local_world_size)
    return tensor_data_step([build_block(shape)], my_group(tp_members), my_group(dp_members), layer_inputs(shape),
                            lambda params: torch.optim.SGD(params, lr=1e-3), probe_loss)


def tp_mesh_job() -> dict:
    """Both placements, one warm-up step each, then interleaved rounds: seconds per step (the slowest rank's, after
    a barrier) and this node's eth0 bytes per step."""
    me = join_node_group()
    params = job_params()
    if params.get("rate_mbit_s"):
        shape_own_link(me, float(params["rate_mbit_s"]), params)
    shape = LayerShape(**params.get("shape", {}))
    steps = {p: placement_step(me, p, shape) for p in PLACEMENTS}
    out, share = timed_placements(steps, int(params.get("rounds", 5)))
    return report({**me.as_dict(), **out, "cpu_share": share}, me.rank)


def run_placements(nodes: EmulatedNodes, shape: LayerShape, rounds: int = 5, rate_mbit_s: float | None = None,
                   timeout_s: float = 120.0) -> JobResult:
    """Run :func:`tp_mesh_job` on 2 ranks per node of ``nodes`` (re-shaping the link first when a rate is given)."""
    params = {"shape": asdict(shape), "rounds": rounds, "rate_mbit_s": rate_mbit_s,
              "burst_bytes": nodes.config.burst_bytes, "limit_bytes": nodes.config.limit_bytes}
    return run_job(nodes, "labkit.cluster.tp_mesh:tp_mesh_job", nproc_per_node=2, params=params, timeout_s=timeout_s)


def predicted_node_bytes(placement: str, shape: LayerShape, per_node: int = 2, nodes: int = 2) -> float:
    """Payload bytes one node sends over the slow link per step: its ranks' bytes in the groups that cross, each a
    ring of ``nodes`` ranks (TP: 4 all-reduces of the DP share's activations; DP: the TP part's fp32 gradients)."""
    tp_size, dp_size = (per_node, nodes) if placement == "tp_inside" else (nodes, per_node)
    block = build_block(shape)
    replicated = 6 * shape.d_model
    local_params = (sum(p.numel() for p in block.parameters()) - replicated) // tp_size + replicated
    if placement == "tp_inside":
        return per_node * ring_bytes_sent("all_reduce", 4 * local_params, dp_size)
    return per_node * tp_bytes_per_layer(shape.batch // dp_size, shape.seq_len, shape.d_model, tp_size)


def placement_rows(results: list[dict], shape: LayerShape, rate_mbit_s: float) -> list[dict]:
    """Per placement: bytes over the slow link per node per step (eth0, the busier node; median over rounds) beside
    the prediction, the link's time for them at the shaped rate, and the median step (the slowest rank's)."""
    rows = []
    for p in PLACEMENTS:
        per_round = list(zip(*(r[p]["tx_bytes"] for r in results if r["local_rank"] == 0)))
        steps = list(zip(*(r[p]["step_s"] for r in results)))
        predicted = predicted_node_bytes(p, shape)
        rows.append({"placement": p, "eth0_bytes": statistics.median(max(b) for b in per_round),
                     "predicted_bytes": predicted, "link_ms": 1e3 * predicted / expected_payload_bytes_s(rate_mbit_s),
                     "step_ms": 1e3 * statistics.median(max(s) for s in steps)})
    return rows


def placement_load(results: list[dict]) -> Load:
    """Each rank's CPU share over the rounds and the spread of the per-round dp_inside / tp_inside step ratio."""
    rounds = len(results[0]["tp_inside"]["step_s"])
    ratios = [max(r["dp_inside"]["step_s"][i] for r in results) / max(r["tp_inside"]["step_s"][i] for r in results)
              for i in range(rounds)]
    return Load.of_ranks(results, spread=relative_spread(ratios))


def measure_placements(shape: LayerShape, rounds: int = 5, config: NodesConfig | None = None,
                       timeout_s: float = 120.0) -> list[dict]:
    """Build the two nodes, run both placements, tear the nodes down (always); every rank's report.

    ``timeout_s``: the job's limit (checked before any node is built); a rank frozen past it is named."""
    positive_number(timeout_s, "timeout_s", hint="a number of seconds")     # checked before any node is built
    with EmulatedNodes(config or NodesConfig.fast()) as nodes:
        return run_placements(nodes, shape, rounds=rounds, timeout_s=timeout_s).results
