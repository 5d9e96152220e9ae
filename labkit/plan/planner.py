"""Which parallelism? Every feasible (dp, tp, pp, cp, ZeRO stage, micro-batch, checkpointing) with its memory per
rank and step time predicted, term by term, ranked, and the winner's reason in one sentence.

Step time = compute + exposed communication, stretched by the pipeline bubble:
- compute: the step's model FLOPs (:meth:`ModelSpec.step_flops`) over all ranks at peak x measured efficiency;
- tensor parallelism: 4 all-reduces per layer per micro-batch of b(s/cp)h values (6 with recomputation, which
  repeats the forward's two), Narayanan et al. 2021 (:func:`labkit.parallel.tensor.cost.tp_bytes_per_layer`);
- context parallelism: ring attention passes cp-1 K/V blocks per layer forward and K/V plus their gradients
  backward (Liu et al. 2023); overlapped with the layer's compute, only the excess counts;
- pipeline: one activation send per stage boundary per micro-batch each way, and the 1F1B bubble
  (p-1)/(m+p-1) (:func:`labkit.parallel.pipeline.schedule_sim.predicted_bubble`, Huang et al. 2019; Narayanan et al. 2021);
- data parallelism: the gradient all-reduce (ZeRO-1/2: reduce-scatter + all-gather, the same volume; ZeRO-3 adds
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
from labkit.comm.two_tier import Link
from labkit.parallel.pipeline.schedule_sim import predicted_bubble
from labkit.parallel.tensor.cost import ALL_REDUCES_PER_LAYER
from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout, ModelSpec, layout_problem, memory_terms


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


def time_terms(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, layout: Layout) -> dict[str, float]:
    """Seconds per step by term for one layout."""
    m, lay = layout.micro_batches(model), layout
    s, b, h = model.seq_len // lay.cp, lay.micro_batch, model.hidden
    act_bytes = b * s * h * device.param_bytes
    compute = model.step_flops(lay.checkpointing) / (lay.ranks * device.peak_flops_per_s * device.efficiency)
    layers = model.layers // lay.pp
    tp_calls = ALL_REDUCES_PER_LAYER + (2 if lay.checkpointing else 0)
    tp_s = tp_calls * layers * m * _all_reduce_s(act_bytes, lay.tp, group_link(cluster, 1, lay.tp))
    cp_link = group_link(cluster, lay.tp, lay.cp)
    kv_bytes = 2 * act_bytes / lay.tp
    cp_comm = 0.0 if lay.cp == 1 else layers * m * (lay.cp - 1) * 3 * cp_link.time_s(kv_bytes)  # K/V, K/V + grads
    attention_share = (model.seq_len / (6 * h)) / (model.step_flops() / (72 * model.global_batch * model.seq_len
                                                                        * model.layers * h * h))
    cp_s = max(0.0, cp_comm - compute * attention_share)     # hidden behind the attention blocks' maths only
    pp_link = group_link(cluster, lay.tp * lay.cp, lay.pp)
    pp_s = 0.0 if lay.pp == 1 else 2 * (m + lay.pp - 2) * pp_link.time_s(act_bytes / lay.tp)
    grad_bytes = model.num_params / (lay.tp * lay.pp) * device.param_bytes
    dp_link = group_link(cluster, lay.tp * lay.cp * lay.pp, lay.dp)
    dp_s = _all_reduce_s(grad_bytes, lay.dp, dp_link) * (1.5 if lay.zero == 3 else 1.0)
    bubble = predicted_bubble(lay.pp, m) / (1 - predicted_bubble(lay.pp, m)) * (compute + tp_s + cp_s)
    return {"compute": compute, "TP all-reduces": tp_s, "CP ring (exposed)": cp_s, "PP sends": pp_s,
            "pipeline bubble": bubble, "DP gradient sync": dp_s}


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

    def allows(self, model: ModelSpec, layout: Layout) -> bool:
        """Every constrained axis of ``layout`` takes one of its allowed values."""
        values = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "zero": layout.zero,
                  "micro_batches": layout.micro_batches(model), "checkpointing": layout.checkpointing}
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
                      max_cp: int = 8, space: Space | None = None) -> list[Layout]:
    """Every layout that can run (divisibility, ranks) within ``space``, before memory is checked.

    tp only takes divisors of both the GPUs and the heads, pp of the GPUs and the layers: the same layouts as
    trying every divisor of the GPU count, without the millions of combinations a large cluster would give."""
    n, out = cluster.world_size, []
    axes = (divisors(math.gcd(n, model.heads)), divisors(math.gcd(n, model.layers)),
            [d for d in range(1, max_cp + 1) if n % d == 0])
    for tp, pp, cp in itertools.product(*axes):
        if n % (tp * pp * cp) or cp > max_cp:
            continue
        dp = n // (tp * pp * cp)
        for zero, mb, ckpt in itertools.product((0, 1, 2, 3), micro_batches, (False, True)):
            layout = Layout(dp, tp, pp, cp, zero, mb, ckpt)
            if layout_problem(model, cluster, layout) is None and (space is None or space.allows(model, layout)):
                out.append(layout)
    return out


def plan(model: ModelSpec, device: DeviceSpec, cluster: ClusterSpec, micro_batches: tuple[int, ...] = (1, 2, 4),
         selective: bool = True, space: Space | None = None) -> list[Prediction]:
    """Every feasible layout's prediction (within ``space`` if given), fitting ones first, each group fastest first."""
    layouts = enumerate_layouts(model, cluster, micro_batches, space=space)
    preds = [predict(model, device, cluster, lay, selective) for lay in layouts]
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
    mesh = (best.layout.dp, best.layout.tp, best.layout.pp, best.layout.cp)
    rival = next((p for p in ranked[1:] if p.fits and (p.layout.dp, p.layout.tp, p.layout.pp, p.layout.cp) != mesh),
                 None)
    if rival is None:
        return text + "; it is the only mesh that fits"
    gaps = {k: rival.time[k] - best.time[k] for k in best.time}
    term = max(gaps, key=gaps.get)
    return (text + f"; the best other mesh, {rival.layout.label()}, takes {rival.step_s:.3g} s, losing most on "
            f"{term} (+{gaps[term]:.3g} s)")
