"""Which parallelism? Every feasible (dp, tp, pp, cp, ep, ZeRO stage, micro-batch, checkpointing) with its memory per
rank and step time predicted, term by term, ranked, and the winner's reason in one sentence.

Step time = compute + exposed communication, stretched by the pipeline bubble:
- compute: each GEMM of the busiest stage at its shape's rate after the split, attention, element-wise work at
  memory bandwidth, the output layer on the last stage (:mod:`labkit.plan.compute`, :mod:`labkit.plan.rates`);
  MFU is an output;
- tensor parallelism: 4 all-reduces per layer per micro-batch of b(s/cp)h values (6 with recomputation, which
  repeats the forward's two), Narayanan et al. 2021 (:func:`labkit.parallel.tensor.cost.tp_bytes_per_layer`);
- context parallelism: ring attention passes cp-1 K/V blocks per layer forward and K/V plus their gradients
  backward (Liu et al. 2023); each step's transfer overlaps one block's attention, only the excess shows;
- pipeline: one activation send per stage boundary per micro-batch (and chunk) each way, and the bubble of 1F1B
  (p-1)/m, interleaved 1F1B (p-1)/(v m) or ZB-H1 (p-1)/(3m) of the busy time
  (:func:`labkit.parallel.pipeline.schedule_sim.formula_bubble_of_ideal`; Narayanan et al. 2021, Qi et al. 2023);
- expert parallelism (a mixture of experts): two all-to-alls forward and two backward per MoE layer per
  micro-batch of tokens x k x h values, the share (ep-1)/ep leaving the rank (:func:`ep_terms`), not overlapped;
  uneven stages (ceil(L/p) layers on the busiest) stretch compute by the imbalance;
- data parallelism: the gradient all-reduce over dp x cp (as Megatron-LM and FSDP; routed experts' over the
  dp x cp / ep ranks holding them) (ZeRO-1/2: reduce-scatter + all-gather, the same volume; ZeRO-3 adds a
  parameter all-gather, 1.5x: Rajbhandari et al. 2020, Section 7), not overlapped.
Layouts within :data:`TIE` of the fastest are one group (:func:`top_group`): a tie, not a ranking.
Each collective is alpha-beta (:func:`labkit.comm.collectives.allreduce_cost`) on the link its group crosses:
ranks are numbered tp fastest, then cp, pp, dp (Megatron-LM's order); a group whose span exceeds a node uses the
inter-node link.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

from labkit.comm.collectives import allreduce_cost
from labkit.comm.mesh import seq_divisor
from labkit.comm.two_tier import Link
from labkit.parallel.pipeline.schedule_sim import formula_bubble_of_ideal
from labkit.parallel.experts.traffic import ALL_TO_ALLS_PER_LAYER, leaving_share
from labkit.parallel.tensor.cost import ALL_REDUCES_PER_LAYER
from labkit.plan.compute import compute_terms
from labkit.plan.specs import (ClusterSpec, DeviceSpec, Layout, ModelSpec, layout_problem, memory_terms, mesh_problem,
                               schedule_problem)


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted memory (bytes, by term) and step time (seconds, by term)."""

    layout: Layout
    memory: dict
    time: dict
    device_memory_bytes: float

    @cached_property
    def memory_bytes(self) -> float:
        """The busiest rank's total (summed once: ranking 80,000 layouts asks for it again and again)."""
        return float(sum(self.memory.values()))

    @cached_property
    def step_s(self) -> float:
        """Predicted seconds per training step (summed once)."""
        return float(sum(self.time.values()))

    @property
    def fits(self) -> bool:
        """Fits in the device's memory."""
        return self.memory_bytes <= self.device_memory_bytes

    def row(self) -> dict:
        """A table row: the layout, GiB per rank by term, seconds by term."""
        return {"layout": self.layout.label(), "fits": self.fits, "memory_GiB": self.memory_bytes / 2**30,
                **{f"{k} GiB": v / 2**30 for k, v in self.memory.items()}, "step_s": self.step_s,
                **{f"{k} s": v for k, v in self.time.items()}}


def group_link(cluster: ClusterSpec, stride: int, size: int) -> Link:
    """The link a group of ``size`` ranks ``stride`` apart crosses: intra-node if it fits in one node."""
    return cluster.intra if stride * size <= cluster.gpus_per_node else cluster.inter


def _all_reduce_s(nbytes: float, size: int, link: Link) -> float:
    return 0.0 if size == 1 else allreduce_cost("ring", size, int(nbytes), link.alpha_s, link.beta_s_per_byte)


def ep_link(cluster: ClusterSpec, layout: Layout) -> Link:
    """The link an expert group crosses: its ep ranks are consecutive members of a dp x cp group (cp fastest, each
    cp step tp ranks apart, each dp step tp x cp x pp apart), intra-node only if they all sit in one node."""
    lay = layout
    if lay.ep <= lay.cp:
        extent = (lay.ep - 1) * lay.tp + 1
    else:
        extent = (lay.ep // lay.cp - 1) * lay.tp * lay.cp * lay.pp + (lay.cp - 1) * lay.tp + 1
    return cluster.intra if extent <= cluster.gpus_per_node else cluster.inter


def all_to_all_s(nbytes_sent: float, size: int, link: Link) -> float:
    """One all-to-all in which each rank sends ``nbytes_sent`` to the size - 1 others: a message to each (alpha
    each), the bytes through the rank's link (Thakur et al. 2005's pairwise exchange)."""
    return 0.0 if size == 1 else (size - 1) * link.alpha_s + nbytes_sent * link.beta_s_per_byte


def ep_terms(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, layout: Layout) -> float:
    """Seconds of the all-to-alls on the busiest stage: per MoE layer per micro-batch two forward (dispatch,
    combine) and two backward (two more when recomputed), each of tokens x k x h x bytes x (ep-1)/ep per rank,
    tokens = b s / (cp tp) (sequence parallelism shards them over tp before dispatch, as torchtitan does);
    not overlapped with compute (DeepSeek-V3's DualPipe hides them; the planner cannot)."""
    if layout.ep == 1 or not model.moe_layers:
        return 0.0
    tokens = layout.micro_batch * model.seq_len / (layout.cp * layout.tp)
    nbytes = tokens * model.moe.top_k * model.hidden * device.param_bytes * leaving_share(layout.ep)
    calls = ALL_TO_ALLS_PER_LAYER + (2 if layout.checkpointing else 0)
    moe_on_stage = -(-model.moe_layers // layout.pp)
    return calls * moe_on_stage * layout.micro_batches(model) * all_to_all_s(nbytes, layout.ep,
                                                                              ep_link(cluster, layout))


def data_link(cluster: ClusterSpec, layout: Layout) -> Link:
    """The link the dp x cp gradient group crosses: cp ranks tp apart, dp ranks tp x cp x pp apart, its span
    (dp-1) tp cp pp + (cp-1) tp + 1 ranks; intra-node only if that fits in one node."""
    lay = layout
    span = (lay.dp - 1) * lay.tp * lay.cp * lay.pp + (lay.cp - 1) * lay.tp + 1
    return cluster.intra if span <= cluster.gpus_per_node else cluster.inter


def bubble_ratio(layout: Layout, micro_batches: int) -> float:
    """Pipeline idle over busy time: 1F1B (p-1)/m, interleaved (p-1)/(v m), ZB-H1 (p-1)/(3m), each as
    :func:`labkit.parallel.pipeline.schedule_sim.formula_bubble_of_ideal` gives it (0 without a pipeline)."""
    if layout.pp == 1:
        return 0.0
    schedule = ("ScheduleInterleavedZeroBubble" if layout.zero_bubble else
                "ScheduleInterleaved1F1B" if layout.v > 1 else "Schedule1F1B")
    return formula_bubble_of_ideal(schedule, layout.v, layout.pp, micro_batches)


def time_terms(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, layout: Layout,
               selective: bool = True) -> dict[str, float]:
    """Seconds per step by term for one layout."""
    m, lay = layout.micro_batches(model), layout
    s, b, h = model.seq_len // lay.cp, lay.micro_batch, model.hidden
    act_bytes = b * s * h * device.param_bytes
    compute, block = compute_terms(model, device, lay, selective)
    layers = lay.stage_layers(model)
    tp_calls = ALL_REDUCES_PER_LAYER + (2 if lay.checkpointing else 0)
    tp_s = tp_calls * layers * m * _all_reduce_s(act_bytes, lay.tp, group_link(cluster, 1, lay.tp))
    kv_s = group_link(cluster, lay.tp, lay.cp).time_s(2 * act_bytes / lay.tp * model.kv / model.heads)
    # each ring step sends a K/V block while the previous block's attention runs: only the excess shows, forward
    # (again when recomputed) and backward (K/V and their gradients, 2x the bytes, against 2x the maths)
    exposed_step = (1 + lay.checkpointing) * max(0.0, kv_s - block) + max(0.0, 2 * kv_s - 2 * block)
    cp_s = 0.0 if lay.cp == 1 else layers * m * (lay.cp - 1) * exposed_step
    pp_link = group_link(cluster, lay.tp * lay.cp, lay.pp)
    pp_s = 0.0 if lay.pp == 1 else 2 * (m * lay.v + lay.pp - 2) * pp_link.time_s(act_bytes / lay.tp)
    ep_s = ep_terms(model, device, cluster, lay)
    dense_grad_bytes = (model.num_params - model.expert_params) / (lay.tp * lay.pp) * device.param_bytes
    expert_grad_bytes = model.expert_params / (lay.tp * lay.pp * lay.ep) * device.param_bytes
    dp_link = data_link(cluster, lay)
    expert_s = _all_reduce_s(expert_grad_bytes, lay.expert_dp, dp_link) if expert_grad_bytes else 0.0
    dp_s = (_all_reduce_s(dense_grad_bytes, lay.data_ranks, dp_link) + expert_s) * (1.5 if lay.zero == 3 else 1.0)
    bubble = bubble_ratio(lay, m) * (compute + tp_s + cp_s + ep_s)
    return {"compute": compute, "TP all-reduces": tp_s, "CP ring (exposed)": cp_s, "PP sends": pp_s,
            "EP all-to-alls": ep_s, "pipeline bubble": bubble, "DP gradient sync": dp_s}


def predict(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, layout: Layout, selective: bool = True,
            layer_bytes: float | None = None, layer_input_bytes: float | None = None) -> Prediction:
    """Memory and step time of one layout (one clear ValueError when it cannot run at all)."""
    problem = layout_problem(model, cluster, layout)
    if problem:
        raise ValueError(f"{layout.label()}: {problem}")
    return Prediction(layout, memory_terms(model, device, layout, selective, layer_bytes, layer_input_bytes),
                      time_terms(model, device, cluster, layout, selective), device.memory_bytes)


@dataclass(frozen=True)
class Space:
    """The values each axis may take (None: any): the planner's constraint, e.g. what a runner can execute here."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    zero: tuple[int, ...] | None = None
    micro_batches: tuple[int, ...] | None = None     # micro-batches per step (global / (dp x micro-batch size))
    checkpointing: tuple[bool, ...] | None = None
    ep: tuple[int, ...] | None = (1,)                # the kit's runners split no experts: ask for ep to get it
    v: tuple[int, ...] | None = (1,)                 # nor interleave or split backward: ask for v / zero_bubble
    zero_bubble: tuple[bool, ...] | None = (False,)

    def allows(self, model: ModelSpec, layout: Layout) -> bool:
        """Every constrained axis of ``layout`` takes one of its allowed values."""
        values = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "zero": layout.zero,
                  "micro_batches": layout.micro_batches(model), "checkpointing": layout.checkpointing,
                  "ep": layout.ep, "v": layout.v, "zero_bubble": layout.zero_bubble}
        return all(getattr(self, k) is None or v in getattr(self, k) for k, v in values.items())

    def describe(self) -> str:
        """e.g. 'pp in (1,), cp in (1,), ...; tp any'."""
        fixed = [f"{k} in {v}" for k, v in vars(self).items() if v is not None]
        free = [k for k, v in vars(self).items() if v is None]
        return ", ".join(fixed) + (f"; {', '.join(free)} any" if free else "")


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending (trial division up to sqrt(n): a million GPUs take a millisecond)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def schedules(model: ModelSpec, pp: int) -> list[tuple[int, bool]]:
    """(v, zero_bubble) pairs a pipeline of ``pp`` stages may use: plain 1F1B, ZB-H1, and interleaved 1F1B for
    every v > 1 with L divisible by pp x v (one pair, plain, without a pipeline)."""
    if pp == 1:
        return [(1, False)]
    chunks = model.layers // pp if model.layers % pp == 0 else 1
    return [(1, False), (1, True)] + [(v, False) for v in divisors(chunks) if v > 1]


def enumerate_layouts(model: ModelSpec, cluster: ClusterSpec, micro_batches: tuple[int, ...] = (1, 2, 4),
                      max_cp: int | None = None, space: Space | None = None,
                      uneven_stages: bool = False) -> list[Layout]:
    """Every layout that can run (divisibility, ranks) within ``space``, before memory is checked.

    tp only takes divisors of both the GPUs and the heads, pp of the GPUs and the layers (any pp up to the layers
    with ``uneven_stages``), cp any divisor of the GPUs up to ``max_cp`` (None: no cap), ep (for a mixture of
    experts) the divisors of dp x cp and the experts: the same layouts as trying every divisor of the GPU count,
    without the millions of combinations a large cluster would give."""
    n, out = cluster.world_size, []
    pps = [d for d in divisors(n) if d <= model.layers] if uneven_stages else divisors(math.gcd(n, model.layers))
    axes = (divisors(math.gcd(n, model.heads)), pps,
            [d for d in divisors(n) if max_cp is None or d <= max_cp])
    for tp, pp, cp in itertools.product(*axes):
        if n % (tp * pp * cp) or model.seq_len % seq_divisor(tp, cp):     # the mesh's sequence rule, checked early
            continue
        dp = n // (tp * pp * cp)
        eps = divisors(math.gcd(dp * cp, model.moe.experts)) if model.moe else [1]
        for ep in eps:
            if mesh_problem(model, cluster, Layout(dp, tp, pp, cp, ep=ep)):      # the mesh's rules, once per mesh
                continue
            for zero, mb, ckpt, (v, zb) in itertools.product((0, 1, 2, 3), micro_batches, (False, True),
                                                             schedules(model, pp)):
                layout = Layout(dp, tp, pp, cp, zero, mb, ckpt, ep, v, zb)
                if schedule_problem(model, layout) is None and (space is None or space.allows(model, layout)):
                    out.append(layout)
    return out


def plan(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, micro_batches: tuple[int, ...] = (1, 2, 4),
         selective: bool = True, space: Space | None = None, max_cp: int | None = None,
         uneven_stages: bool = False) -> list[Prediction]:
    """Every feasible layout's prediction (within ``space`` if given), fitting ones first, each group fastest first."""
    layouts = enumerate_layouts(model, cluster, micro_batches, max_cp=max_cp, space=space, uneven_stages=uneven_stages)
    preds = [Prediction(lay, memory_terms(model, device, lay, selective),
                        time_terms(model, device, cluster, lay, selective),
                        device.memory_bytes) for lay in layouts]                 # each checked as enumerated
    if not preds:
        within = f" within {space.describe()}" if space else ""
        raise ValueError(f"no layout of {cluster.world_size} GPUs can split {model.name}{within}: check that heads, "
                         "layers, sequence and global batch divide")
    return sorted(preds, key=lambda p: (not p.fits, p.step_s, p.memory_bytes))


# Layouts whose predicted steps differ by less than this are ties: the planner's own error. 10 %: the self-score
# on this machine predicts steps to about that (notebook 14), and the SC21 rows below miss by more, so no finer
# margin is claimed.
TIE = 0.10


def top_group(ranked: list[Prediction], tie: float = TIE) -> list[Prediction]:
    """The layouts that fit and predict a step within ``tie`` of the fastest: one group, not a ranking."""
    if not ranked or not ranked[0].fits:
        return []
    return [p for p in ranked if p.fits and p.step_s <= ranked[0].step_s * (1 + tie)]


def _mesh(p: Prediction) -> tuple:
    return (p.layout.dp, p.layout.tp, p.layout.pp, p.layout.cp, p.layout.ep)


def why_it_wins(ranked: list[Prediction], tie: float = TIE) -> str:
    """One sentence: the top group (layouts within ``tie`` of the fastest, their meshes), and what the best mesh
    outside it loses most on; no reason is given between members of the group."""
    best = ranked[0]
    if not best.fits:
        return (f"nothing fits: the smallest need is {min(p.memory_bytes for p in ranked) / 2**30:.1f} GiB per rank "
                f"against {best.device_memory_bytes / 2**30:.0f} GiB")
    group = top_group(ranked, tie)
    meshes = list(dict.fromkeys(_mesh(p) for p in group))
    text = (f"{best.layout.label()} fits ({best.memory_bytes / 2**30:.1f} of {best.device_memory_bytes / 2**30:.0f} "
            f"GiB) and predicts {best.step_s:.3g} s per step")
    if len(group) > 1:
        text += (f"; {len(group)} layouts on {len(meshes)} mesh(es) are within {tie:.0%} of it, the planner's own "
                 "error: a tie, not a ranking")
    rival = next((p for p in ranked if p.fits and _mesh(p) not in meshes), None)
    if rival is None:
        return text + "; no mesh outside the top group fits"
    gaps = {k: rival.time[k] - best.time[k] for k in best.time}
    term = max(gaps, key=gaps.get)
    return (text + f"; the best other mesh, {rival.layout.label()}, takes {rival.step_s:.3g} s, losing most on "
            f"{term} (+{gaps[term]:.3g} s)")
