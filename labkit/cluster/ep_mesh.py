"""Where expert parallelism goes: the kit's MoE layer on two emulated nodes of two ranks, placed three ways.

``ep_inside``: each node's two ranks form an EP group (experts 0-3 on the first, 4-7 on the second), and the ranks
holding the same experts pair across the nodes, so only the expert gradients' all-reduce crosses the shaped link.
``ep_across``: the EP pairs span the nodes, so the four all-to-alls per layer cross it, and the gradients stay
inside. ``tp_across``: the same cross-node pairs, but every expert split by columns and rows over the pair
(:class:`labkit.parallel.experts.dispatch.TensorParallelExperts`) instead of placed whole. The same layer, the same
tokens per rank, one step each through the kit's one step (forward, backward, gradients summed; no update, which
sends nothing), timed in interleaved rounds; the bytes over the slow link are read from each node's ``eth0``
counters (as :mod:`labkit.cluster.tp_mesh` does for TP).
The router sits on every rank: its gradient is summed over both groups in every placement.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace

import torch
import torch.distributed as dist

from labkit.cluster.link_jobs import join_node_group, shape_own_link, timed_placements
from labkit.cluster.linkfit import expected_payload_bytes_s
from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.rankside import Place, job_params, report
from labkit.cluster.run import JobResult, run_job
from labkit.comm.mesh import AxisGroup, Mesh, my_group
from labkit.core.step import TrainStep
from labkit.core.validation import positive_int, positive_number
from labkit.core.verdict import Load, Rival, Verdict, judge_at_least, relative_spread
from labkit.parallel.experts.dispatch import ExpertParallelMoE, TensorParallelExperts
from labkit.parallel.experts.moe import MoE, MoEConfig
from labkit.parallel.experts.traffic import ALL_TO_ALLS_PER_LAYER, ep_bytes_per_layer, leaving_share
from labkit.sharding.comm_volume import ring_bytes_sent

PLACEMENTS = ("ep_inside", "ep_across", "tp_across")
BYTES_PER_ELEMENT = 4                     # fp32 activations and gradients


@dataclass(frozen=True)
class PlacementShape:
    """The MoE layer placed: tokens per rank, model width, expert FFN width, experts, experts per token. The
    capacity factor is E/k, so capacity = tokens and nothing is dropped: every placement computes the same copies."""

    tokens: int = 1024
    hidden: int = 64
    ffn: int = 64
    experts: int = 8
    top_k: int = 1

    def __post_init__(self) -> None:
        for name in ("tokens", "hidden", "ffn", "experts", "top_k"):
            positive_int(getattr(self, name), name)
        self.config()                                           # top_k <= experts, checked there

    def config(self) -> MoEConfig:
        """The layer's :class:`MoEConfig` (capacity factor E/k: no copy dropped)."""
        return MoEConfig(hidden=self.hidden, ffn=self.ffn, experts=self.experts, top_k=self.top_k,
                         capacity_factor=self.experts / self.top_k)

    @classmethod
    def smoke(cls) -> "PlacementShape":
        """A tiny layer for the tests."""
        return cls(tokens=256, hidden=32, ffn=32)


def mesh_members(placement: str, nodes: int, per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """(expert groups, replica groups) as lists of global ranks (node-major: rank = node * per_node + local).

    One grid, :class:`labkit.comm.mesh.Mesh` with ep carved from dp: its EP groups are consecutive ranks, a node's.
    The replicas of a group's experts are the ranks at the same place in every node (the groups' transpose).
    ``ep_inside`` uses them as they are; ``ep_across`` and ``tp_across`` swap the two roles."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    inside = Mesh(dp=positive_int(nodes, "nodes") * positive_int(per_node, "per_node"), ep=per_node).members("ep")
    across = [list(ranks) for ranks in zip(*inside)]
    return (inside, across) if placement == "ep_inside" else (across, inside)


def _all_reduce_flat(grads: list[torch.Tensor], group: object) -> None:
    """Sum ``grads`` over ``group`` in one message (one bucket, as DDP's buckets do)."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def rank_tokens(shape: PlacementShape, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's tokens, its probe: the loss's fixed gradient), both (tokens, hidden), seeded by the rank."""
    gen = torch.Generator().manual_seed(1000 + rank)
    size = (shape.tokens, shape.hidden)
    return torch.randn(size, generator=gen), torch.randn(size, generator=gen)


def node_groups(me: Place) -> dict[str, AxisGroup]:
    """This rank's two groups, created once for all three placements: 'inside' (its node's ranks, the mesh's EP
    groups) and 'across' (the ranks at its place in every node)."""
    nodes = me.world_size // me.local_world_size
    inside, across = mesh_members("ep_inside", nodes, me.local_world_size)
    return {"inside": my_group(inside), "across": my_group(across)}


def placement_step(me: Place, placement: str, shape: PlacementShape, groups: dict[str, AxisGroup]) -> TrainStep:
    """This rank's step for ``placement``: its part of the experts, its own tokens, forward, backward and the
    gradients summed over the groups (no update)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    roles = ("inside", "across") if placement == "ep_inside" else ("across", "inside")
    experts, replicas = (groups[role] for role in roles)
    reference = MoE(shape.config(), seed=0)
    kind = TensorParallelExperts if placement == "tp_across" else ExpertParallelMoE
    layer = kind(reference, experts.index, experts.size, group=experts.group)

    def sync(model: torch.nn.Module) -> None:
        router = [p.grad for p in model.router.parameters()]
        _all_reduce_flat(router, experts.group)                 # the router's part from the group's tokens
        _all_reduce_flat([p.grad for p in model.parameters() if p.grad is not None], replicas.group)

    # no optimizer: an update sends nothing over any link, and torch.optim's first use imports the compiler
    # (~130 MiB) into each forked rank, which notebook 15's memory budget cannot hold
    step = TrainStep(layer, None, loss_fn=lambda y, probe: (y * probe).sum(), grad_hook=sync)
    x, probe = rank_tokens(shape, me.rank)
    # the layer's input comes from the layers below: its gradient goes back through the all-to-alls too
    step.feed = (x.requires_grad_(), probe)                     # type: ignore[attr-defined]
    return step


def ep_mesh_job() -> dict:
    """All three placements, one warm-up step each, then interleaved rounds: seconds per step (after a barrier) and
    this node's eth0 bytes per step; the EP placements' split sizes (rows sent to and received from each peer)."""
    me = join_node_group()
    params = job_params()
    if params.get("rate_mbit_s"):
        shape_own_link(me, float(params["rate_mbit_s"]), params)
    shape = PlacementShape(**params.get("shape", {}))
    groups = node_groups(me)
    steps = {p: placement_step(me, p, shape, groups) for p in PLACEMENTS}
    out, share = timed_placements(steps, int(params.get("rounds", 5)))
    splits = {p: {k: steps[p].model.last[k] for k in ("send", "recv")} for p in PLACEMENTS if p != "tp_across"}
    return report({**me.as_dict(), **out, "splits": splits, "cpu_share": share}, me.rank)


def run_placements(nodes: EmulatedNodes, shape: PlacementShape, rounds: int = 5, rate_mbit_s: float | None = None,
                   timeout_s: float = 120.0) -> JobResult:
    """Run :func:`ep_mesh_job` on 2 ranks per node of ``nodes`` (re-shaping the link first when a rate is given)."""
    params = {"shape": asdict(shape), "rounds": rounds, "rate_mbit_s": rate_mbit_s,
              "burst_bytes": nodes.config.burst_bytes, "limit_bytes": nodes.config.limit_bytes}
    return run_job(nodes, "labkit.cluster.ep_mesh:ep_mesh_job", nproc_per_node=2, params=params, timeout_s=timeout_s)


def measure_placements(shape: PlacementShape, rounds: int = 5, config: NodesConfig | None = None,
                       timeout_s: float = 120.0) -> list[dict]:
    """Build the two nodes, run the three placements, tear the nodes down (always); every rank's report.

    Every argument is checked before any node is built or any rank starts: a bad one is one line."""
    if not isinstance(shape, PlacementShape):
        raise TypeError(f"shape must be a PlacementShape, got {type(shape).__name__}")
    positive_int(rounds, "rounds", hint="interleaved rounds of the three placements")
    positive_number(timeout_s, "timeout_s", hint="a number of seconds")
    if config is not None and config.nodes != 2:
        raise ValueError(f"the placements are laid out on 2 nodes of 2 ranks; got NodesConfig(nodes={config.nodes})")
    shape.config().experts_per_rank(2)                          # the experts split over a pair of ranks
    if shape.ffn % 2:
        raise ValueError(f"ffn={shape.ffn} must split evenly over the 2 ranks of a TP pair")
    with EmulatedNodes(config or NodesConfig.fast()) as nodes:
        return run_placements(nodes, shape, rounds=rounds, timeout_s=timeout_s).results


def placement_layout(placement: str, shape: PlacementShape, nodes: int = 2, per_node: int = 2) -> dict[int, str]:
    """What each rank holds under ``placement``: 'experts 0-3' (whole) or 'experts 0-7, FFN cols 0-31' (split)."""
    groups, _ = mesh_members(placement, nodes, per_node)
    out = {}
    for ranks in groups:
        for index, rank in enumerate(ranks):
            if placement == "tp_across":
                width = shape.ffn // len(ranks)
                out[rank] = f"experts 0-{shape.experts - 1},\nFFN cols {index * width}-{(index + 1) * width - 1}"
            else:
                per_rank = shape.experts // len(ranks)
                out[rank] = f"experts {index * per_rank}-{(index + 1) * per_rank - 1}"
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------------------- the model
def expert_param_count(shape: PlacementShape, ep: int) -> int:
    """Parameters of the experts one of ``ep`` ranks holds (fc1 and fc2, weights and biases)."""
    return shape.experts // ep * (2 * shape.hidden * shape.ffn + shape.ffn + shape.hidden)


def tp_expert_bytes(tokens: int, hidden: int, tp: int, bytes_per_element: int = BYTES_PER_ELEMENT) -> float:
    """Bytes one rank sends per layer with the experts split over ``tp`` ranks: the group's tokens all-gathered in
    and the partial outputs summed back (each (tp - 1) x tokens x hidden), forward and backward: 4 (tp - 1) T h b."""
    return ALL_TO_ALLS_PER_LAYER * (positive_int(tp, "tp") - 1) * tokens * hidden * bytes_per_element


def predicted_node_bytes(placement: str, shape: PlacementShape, per_node: int = 2, nodes: int = 2) -> float:
    """Payload bytes one node sends over the slow link per step: its ranks' bytes in the groups that cross.

    ``ep_inside``: the expert and router gradients, a ring all-reduce over the ``nodes`` replicas. ``ep_across``:
    4 x tokens x k x h x b x (ep-1)/ep (two all-to-alls forward, two backward), and the router's gradient.
    ``tp_across``: 4 (tp-1) x tokens x h x b, and the router's gradient."""
    mesh_members(placement, nodes, per_node)
    router = (shape.hidden + 1) * shape.experts
    if placement == "ep_inside":
        grads = (expert_param_count(shape, per_node) + router) * BYTES_PER_ELEMENT
        return per_node * ring_bytes_sent("all_reduce", grads, nodes)
    router_bytes = ring_bytes_sent("all_reduce", router * BYTES_PER_ELEMENT, nodes)
    if placement == "ep_across":
        moved = ep_bytes_per_layer(shape.tokens * shape.top_k, shape.hidden, nodes, BYTES_PER_ELEMENT)
    else:
        moved = tp_expert_bytes(shape.tokens, shape.hidden, nodes)
    return per_node * (moved + router_bytes)


def share_noise(shape: PlacementShape, per_node: int = 2, nodes: int = 2, sds: float = 3.0) -> float:
    """Relative band for one node's all-to-all bytes under ``ep_across``: which peer a copy's expert sits on is a
    draw. The node sends its copies that leave, (1 - p) of them, and returns its peers' copies that came, p of
    theirs: each a binomial share of tokens x k copies per rank, so ``sds`` standard deviations of their sum."""
    f = leaving_share(nodes)
    copies = shape.tokens * shape.top_k
    return sds * math.sqrt(2 * f * (1 - f) / (copies * per_node)) / (2 * f)


def placement_rows(results: list[dict], shape: PlacementShape, rate_mbit_s: float) -> list[dict]:
    """Per placement: bytes over the slow link per node per step (eth0, the busier node; median over rounds) beside
    the prediction, the link's time for them at the shaped rate, and the median step (the slowest rank's)."""
    rows = []
    for p in PLACEMENTS:
        per_round = list(zip(*(r[p]["tx_bytes"] for r in results if r["local_rank"] == 0)))
        predicted = predicted_node_bytes(p, shape)
        rows.append({"placement": p, "eth0_bytes": statistics.median(max(b) for b in per_round),
                     "predicted_bytes": predicted, "link_ms": 1e3 * predicted / expected_payload_bytes_s(rate_mbit_s),
                     "step_ms": 1e3 * statistics.median(step_by_round(results, p))})
    return rows


def step_by_round(results: list[dict], placement: str) -> list[float]:
    """Seconds per step of ``placement`` in each round: the slowest rank's."""
    return [max(steps) for steps in zip(*(r[placement]["step_s"] for r in results))]


def placement_load(results: list[dict], slower: str, faster: str) -> Load:
    """Each rank's CPU share over the rounds and the spread of the per-round ``slower`` / ``faster`` step ratio."""
    ratios = [s / f for s, f in zip(step_by_round(results, slower), step_by_round(results, faster))]
    return Load.of_ranks(results, spread=relative_spread(ratios))


def judge_winner(claim: str, results: list[dict], rows: list[dict], expected: str, other: str) -> Verdict:
    """The alpha-beta model (bytes over the link at the shaped rate's payload rate; alpha left out) must name
    ``expected`` the winner over ``other`` (else failed), and the clock must agree by at least half the predicted
    gap, paired round by round.

    The threshold is the loser's step over the winner's that half the predicted link-time gap would give on the
    winner's measured step: the rival "placement does not matter" is a ratio of 1, under it."""
    by_name = {r["placement"]: r for r in rows}
    link = (f"model: {by_name[expected]['link_ms']:.1f} ms on the link for {expected}, "
            f"{by_name[other]['link_ms']:.1f} for {other}")
    gap_ms = by_name[other]["link_ms"] - by_name[expected]["link_ms"]
    if gap_ms <= 0:
        return Verdict(claim, "failed", f"{link}: the model names {other}, not {expected}")
    threshold = 1 + 0.5 * gap_ms / by_name[expected]["step_ms"]
    ratios = [s / f for s, f in zip(step_by_round(results, other), step_by_round(results, expected))]
    verdict = judge_at_least(claim, statistics.median(ratios), threshold, load=placement_load(results, other, expected),
                             by_round=[(r, threshold) for r in ratios], rival=Rival("placement does not matter", 1.0))
    return replace(verdict, detail=f"{link}; {other} / {expected} step: {verdict.detail}")
