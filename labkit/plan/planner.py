"""Which parallelism? Every feasible (dp, tp, pp, cp, ep, ZeRO stage, micro-batch, checkpointing) with its memory per
rank and step time predicted, term by term, ranked, and the winner's reason in one sentence.

Step time = compute + exposed communication, stretched by the pipeline bubble:
- compute: the step's model FLOPs (:meth:`ModelSpec.step_flops`) over all ranks at peak x measured efficiency;
- tensor parallelism: 4 all-reduces per layer per micro-batch of b(s/cp)h values (6 with recomputation, which
  repeats the forward's two), Narayanan et al. 2021 (:func:`labkit.parallel.tensor.cost.tp_bytes_per_layer`);
- context parallelism: ring attention passes cp-1 K/V blocks per layer forward and K/V plus their gradients
  backward (Liu et al. 2023); overlapped with the layer's compute, only the excess counts;
- pipeline: one activation send per stage boundary per micro-batch each way, and the 1F1B bubble
  (p-1)/(m+p-1) (:func:`labkit.parallel.pipeline.schedule_sim.predicted_bubble`, Huang et al. 2019; Narayanan et al. 2021);
- expert parallelism (a mixture of experts): two all-to-alls forward and two backward per MoE layer per
  micro-batch of tokens x k x h values, the share (ep-1)/ep leaving the rank (:func:`ep_terms`), not overlapped;
  uneven stages (ceil(L/p) layers on the busiest) stretch compute by the imbalance;
- data parallelism: the gradient all-reduce (routed experts' over the dp x cp / ep ranks holding them) (ZeRO-1/2: reduce-scatter + all-gather, the same volume; ZeRO-3 adds
  a parameter all-gather, 1.5x: Rajbhandari et al. 2020, Section 7), not overlapped.
Each collective is alpha-beta (:func:`labkit.comm.collectives.allreduce_cost`) on the link its group crosses:
ranks are numbered tp fastest, then cp, pp, dp (Megatron-LM's order); a group whose span exceeds a node uses the
inter-node link.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from labkit.comm.collectives import allreduce_cost
from labkit.comm.mesh import seq_divisor
from labkit.comm.two_tier import Link
from labkit.parallel.pipeline.schedule_sim import predicted_bubble
from labkit.parallel.experts.traffic import ALL_TO_ALLS_PER_LAYER, leaving_share
from labkit.parallel.tensor.cost import ALL_REDUCES_PER_LAYER
from labkit.plan.specs import (ClusterSpec, DeviceSpec, Layout, ModelSpec, layout_problem, memory_terms, mesh_problem,
                               schedule_problem)


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted memory (bytes, by term) and step time (seconds, by term)."""

    layout: Layout
    memory: dict
    time: dict
    device_memory_bytes: float

    @property
    def memory_bytes(self) -> float:
        """The busiest rank's total."""
        return float(sum(self.memory.values()))

    @property
    def step_s(self) -> float:
        """Predicted seconds per training step."""
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


def time_terms(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, layout: Layout) -> dict[str, float]:
    """Seconds per step by term for one layout."""
    m, lay = layout.micro_batches(model), layout
    s, b, h = model.seq_len // lay.cp, lay.micro_batch, model.hidden
    act_bytes = b * s * h * device.param_bytes
    imbalance = lay.stage_layers(model) * lay.pp / model.layers       # the busiest stage sets the pace
    compute = model.step_flops(lay.checkpointing) / (lay.ranks * device.peak_flops_per_s * device.efficiency) \
        * imbalance
    layers = lay.stage_layers(model)
    tp_calls = ALL_REDUCES_PER_LAYER + (2 if lay.checkpointing else 0)
    tp_s = tp_calls * layers * m * _all_reduce_s(act_bytes, lay.tp, group_link(cluster, 1, lay.tp))
    cp_link = group_link(cluster, lay.tp, lay.cp)
    kv_bytes = 2 * act_bytes / lay.tp * model.kv / model.heads                  # K and V, shrunk by GQA
    cp_comm = 0.0 if lay.cp == 1 else layers * m * (lay.cp - 1) * 3 * cp_link.time_s(kv_bytes)  # K/V, K/V + grads
    attention_share = model.attention_flops() / model.step_flops()
    cp_s = max(0.0, cp_comm - compute * attention_share)     # hidden behind the attention blocks' maths only
    pp_link = group_link(cluster, lay.tp * lay.cp, lay.pp)
    pp_s = 0.0 if lay.pp == 1 else 2 * (m + lay.pp - 2) * pp_link.time_s(act_bytes / lay.tp)
    ep_s = ep_terms(model, device, cluster, lay)
    dense_grad_bytes = (model.num_params - model.expert_params) / (lay.tp * lay.pp) * device.param_bytes
    expert_grad_bytes = model.expert_params / (lay.tp * lay.pp * lay.ep) * device.param_bytes
    dp_link = group_link(cluster, lay.tp * lay.cp * lay.pp, lay.dp)
    expert_s = _all_reduce_s(expert_grad_bytes, lay.expert_dp, dp_link) if expert_grad_bytes else 0.0
    dp_s = (_all_reduce_s(dense_grad_bytes, lay.dp, dp_link) + expert_s) * (1.5 if lay.zero == 3 else 1.0)
    idle = predicted_bubble(lay.pp, m)
    bubble = idle / (1 - idle) * (compute + tp_s + cp_s + ep_s)
    return {"compute": compute, "TP all-reduces": tp_s, "CP ring (exposed)": cp_s, "PP sends": pp_s,
            "EP all-to-alls": ep_s, "pipeline bubble": bubble, "DP gradient sync": dp_s}


def predict(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, layout: Layout, selective: bool = True,
            layer_bytes: float | None = None, layer_input_bytes: float | None = None) -> Prediction:
    """Memory and step time of one layout (one clear ValueError when it cannot run at all)."""
    problem = layout_problem(model, cluster, layout)
    if problem:
        raise ValueError(f"{layout.label()}: {problem}")
    return Prediction(layout, memory_terms(model, device, layout, selective, layer_bytes, layer_input_bytes),
                      time_terms(model, device, cluster, layout), device.memory_bytes)


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

    def allows(self, model: ModelSpec, layout: Layout) -> bool:
        """Every constrained axis of ``layout`` takes one of its allowed values."""
        values = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "zero": layout.zero,
                  "micro_batches": layout.micro_batches(model), "checkpointing": layout.checkpointing,
                  "ep": layout.ep}
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
            for zero, mb, ckpt in itertools.product((0, 1, 2, 3), micro_batches, (False, True)):
                layout = Layout(dp, tp, pp, cp, zero, mb, ckpt, ep)
                if schedule_problem(model, layout) is None and (space is None or space.allows(model, layout)):
                    out.append(layout)
    return out


def plan(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, micro_batches: tuple[int, ...] = (1, 2, 4),
         selective: bool = True, space: Space | None = None, max_cp: int | None = None,
         uneven_stages: bool = False) -> list[Prediction]:
    """Every feasible layout's prediction (within ``space`` if given), fitting ones first, each group fastest first."""
    layouts = enumerate_layouts(model, cluster, micro_batches, max_cp=max_cp, space=space, uneven_stages=uneven_stages)
    preds = [Prediction(lay, memory_terms(model, device, lay, selective), time_terms(model, device, cluster, lay),
                        device.memory_bytes) for lay in layouts]                 # each checked as enumerated
    if not preds:
        within = f" within {space.describe()}" if space else ""
        raise ValueError(f"no layout of {cluster.world_size} GPUs can split {model.name}{within}: check that heads, "
                         "layers, sequence and global batch divide")
    return sorted(preds, key=lambda p: (not p.fits, p.step_s, p.memory_bytes))


def why_it_wins(ranked: list[Prediction]) -> str:
    """One sentence: the winner's step and memory, and the term where the best other mesh loses most."""
    best = ranked[0]
    if not best.fits:
        return (f"nothing fits: the smallest need is {min(p.memory_bytes for p in ranked) / 2**30:.1f} GiB per rank "
                f"against {best.device_memory_bytes / 2**30:.0f} GiB")
    text = (f"{best.layout.label()} fits ({best.memory_bytes / 2**30:.1f} of {best.device_memory_bytes / 2**30:.0f} "
            f"GiB) and predicts {best.step_s:.3g} s per step")
    mesh = (best.layout.dp, best.layout.tp, best.layout.pp, best.layout.cp, best.layout.ep)
    rival = next((p for p in ranked[1:] if p.fits and
                  (p.layout.dp, p.layout.tp, p.layout.pp, p.layout.cp, p.layout.ep) != mesh),
                 None)
    if rival is None:
        return text + "; it is the only mesh that fits"
    gaps = {k: rival.time[k] - best.time[k] for k in best.time}
    term = max(gaps, key=gaps.get)
    return (text + f"; the best other mesh, {rival.layout.label()}, takes {rival.step_s:.3g} s, losing most on "
            f"{term} (+{gaps[term]:.3g} s)")
