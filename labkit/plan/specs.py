"""What the planner is told (a model, a device, a cluster) and what it predicts a rank holds, each term named.

Model state per rank follows ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, Section 3.1 and Figure 1):
mixed-precision Adam keeps 2 bytes of parameters, 2 of gradients and 12 of optimizer state (fp32 master, momentum,
variance) per parameter, and ZeRO stage 1/2/3 shards the last one, two or three over the data-parallel ranks dp x cp
(:func:`labkit.sharding.memory.sharding_factors`). Tensor and pipeline parallelism split the parameters first.
Activations per layer are Korthikanti et al. 2022 (arXiv:2205.05198, Eq. 1-3) via
:func:`labkit.parallel.tensor.cost.korthikanti_bytes`, with sequence parallelism, on the rank's sequence share s/cp;
``selective`` (the default) drops the 5as^2b score term as their selective recomputation, or a fused/ring attention
kernel, does. With 1F1B the first stage keeps p micro-batches of L/p layers, i.e. L layers' worth (their Section
4.2.3). Full checkpointing keeps each layer's 2sbh input plus one layer recomputed (Chen et al. 2016). GQA, SwiGLU
and experts adjust those terms (:mod:`labkit.plan.shapes`); routed experts divide by ep (borrowed from dp x cp).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from labkit.comm.mesh import Mesh
from labkit.comm.two_tier import Link
from labkit.core.validation import positive_int, positive_number
from labkit.plan.rates import GIB, DeviceSpec  # noqa: F401 - DeviceSpec is part of this module's API
from labkit.plan.shapes import (MoESpec, attention_matmul_params, attention_params, ffn_params, layer_activation_bytes,
                                moe_ffn_params, norm_params, routed_expert_params)
from labkit.sharding.memory import sharding_factors

ZERO_STAGES = (0, 1, 2, 3)
# Sizes past these are typos, not plans; refused in one line before any arithmetic overflows a float.
MAX_PARAMS = 10**15          # 1,000x the largest published dense models (~1e12 parameters)
MAX_TOKENS_PER_STEP = 10**12  # global batch x sequence; 60,000x a 16M-token batch (Llama 3 405B, Dubey et al. 2024)
MAX_GPUS = 10**6             # 5x the largest clusters built (~200k GPUs); more is no layout anyone can check


def _magnitude(n: int) -> str:
    """'1e+201' for an integer of any size (formatting it as a float would overflow)."""
    return f"{n:.3g}" if n < 10**300 else f"1e+{len(str(n)) - 1}"


@dataclass(frozen=True)
class ModelSpec:
    """A transformer: layers, hidden size, heads, sequence, vocabulary; the global batch in sequences. The defaults
    are GPT's layer (multi-head attention, a 4h GELU MLP with biases, tied and learned embeddings); GQA, SwiGLU,
    untied embeddings and a mixture of experts are fields (:mod:`labkit.plan.shapes`)."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    global_batch: int = 8
    name: str = "transformer"
    embedding: bool = True         # False: a bare stack of layers (no embeddings, no output logits)
    kv_heads: int | None = None    # grouped-query attention's K/V heads (None: heads, plain multi-head)
    ffn_hidden: int | None = None  # the FFN's inner size (None: 4 x hidden, GPT's)
    gated_ffn: bool = False        # SwiGLU: three matrices h x F instead of two
    tied_embeddings: bool = True   # False: the output embedding is a matrix of its own (Llama, Mixtral)
    learned_positions: bool = True  # False: rotary positions, no position table
    biases: bool = True            # False: no biases and RMSNorm (2h a layer, a final h), as Llama/Mixtral
    moe: MoESpec | None = None     # a mixture of experts (None: dense)

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "seq_len", "vocab", "global_batch"):
            positive_int(getattr(self, key), key)
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.kv_heads is not None and (positive_int(self.kv_heads, "kv_heads") > self.heads
                                          or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}: each K/V head serves a "
                             "group of query heads (grouped-query attention)")
        if self.ffn_hidden is not None:
            positive_int(self.ffn_hidden, "ffn_hidden")
        if self.moe is not None and not isinstance(self.moe, MoESpec):
            raise ValueError(f"moe must be a labkit.plan.shapes.MoESpec or None, got {self.moe!r}")
        if self.num_params > MAX_PARAMS:
            raise ValueError(f"a model of about {_magnitude(self.num_params)} parameters is past what the planner takes "
                             f"(at most {MAX_PARAMS:.0e}; the largest published have about 1e12): check layers, "
                             "hidden and vocab")
        if self.global_batch * self.seq_len > MAX_TOKENS_PER_STEP:
            raise ValueError(f"global_batch x seq_len = {_magnitude(self.global_batch * self.seq_len)} tokens per step is past "
                             f"what the planner takes (at most {MAX_TOKENS_PER_STEP:.0e})")

    @cached_property
    def kv(self) -> int:
        """K/V heads (the query heads without GQA)."""
        return self.kv_heads or self.heads

    @cached_property
    def ffn(self) -> int:
        """The dense FFN's inner size."""
        return self.ffn_hidden or 4 * self.hidden

    @cached_property
    def moe_layers(self) -> int:
        """How many layers are MoE layers (0 for a dense model)."""
        return self.moe.moe_layers(self.layers) if self.moe else 0

    def _attention_and_norms(self) -> int:
        return attention_params(self.hidden, self.heads, self.kv, self.biases) + norm_params(self.hidden, self.biases)

    @cached_property
    def layer_params(self) -> int:
        """One dense layer: attention + FFN + norms; GPT's 12h^2 + 13h by default (Narayanan et al. 2021)."""
        return self._attention_and_norms() + ffn_params(self.hidden, self.ffn, self.gated_ffn, self.biases)

    @cached_property
    def moe_layer_params(self) -> int:
        """One MoE layer: attention + every expert, shared expert and the router + norms."""
        return self._attention_and_norms() + moe_ffn_params(self.hidden, self.moe, self.gated_ffn, self.biases) \
            if self.moe else self.layer_params

    @cached_property
    def expert_params(self) -> int:
        """The routed experts of every MoE layer: what expert parallelism divides."""
        return self.moe_layers * routed_expert_params(self.hidden, self.moe, self.gated_ffn, self.biases) \
            if self.moe else 0

    @cached_property
    def num_params(self) -> int:
        """All layers plus the token embedding (and its untied output copy), learned positions, a final RMSNorm."""
        if not self.embedding:
            outer = 0
        else:
            outer = self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + \
                (self.seq_len * self.hidden if self.learned_positions else 0) + (0 if self.biases else self.hidden)
        return (self.layers - self.moe_layers) * self.layer_params + self.moe_layers * self.moe_layer_params + outer

    @cached_property
    def active_params(self) -> int:
        """Parameters one token uses: the routed experts it is not sent to left out (shared experts stay)."""
        if not self.moe:
            return self.num_params
        idle = (self.moe.experts - self.moe.top_k) * ffn_params(self.hidden, self.moe.expert_ffn, self.gated_ffn,
                                                                 self.biases)
        return self.num_params - self.moe_layers * idle

    def matmul_params_per_token(self) -> int:
        """The weight matrices one token multiplies (top-k + shared experts, router, output logits)."""
        h, gate = self.hidden, 3 if self.gated_ffn else 2
        attention = attention_matmul_params(h, self.heads, self.kv)
        dense = (self.layers - self.moe_layers) * (attention + gate * h * self.ffn)
        moe = self.moe_layers * (attention + moe_ffn_params(h, self.moe, self.gated_ffn, False, used_only=True)) \
            if self.moe else 0
        return dense + moe + (self.vocab * h if self.embedding else 0)

    def attention_flops(self, recompute: bool = False) -> float:
        """The score and weighted-value products: 4 B s^2 h L forward, x3 with backward (x4 recomputed)."""
        return (4 if recompute else 3) * 4 * self.global_batch * self.seq_len ** 2 * self.hidden * self.layers

    def step_flops(self, recompute: bool = False) -> float:
        """Model FLOPs of one training step: 6 per active matmul parameter per token plus attention, i.e. GPT's
        72 B s L h^2 (1 + s/6h + V/12Lh), 96 B s L h^2 (1 + s/6h + V/16Lh) with full recomputation, which repeats
        the layers' forward, not the logits' (Narayanan et al. 2021, arXiv:2104.04473, Eq. 3); an MoE counts the
        top-k and shared experts a token uses, not all of them."""
        tokens, logits = self.global_batch * self.seq_len, (self.vocab * self.hidden if self.embedding else 0)
        layers = self.matmul_params_per_token() - logits
        return 2 * tokens * ((4 if recompute else 3) * layers + 3 * logits) + self.attention_flops(recompute)


@dataclass(frozen=True)
class ClusterSpec:
    """GPUs per node, nodes, and each tier's alpha-beta link (fitted on live links, or given)."""

    gpus_per_node: int
    nodes: int
    intra: Link = field(default_factory=lambda: Link(5e-6, 1 / 150e9))
    inter: Link = field(default_factory=lambda: Link(20e-6, 1 / 25e9))

    def __post_init__(self) -> None:
        positive_int(self.gpus_per_node, "gpus_per_node")
        positive_int(self.nodes, "nodes")
        if self.world_size > MAX_GPUS:
            raise ValueError(f"a cluster of {self.world_size:,} GPUs ({self.nodes:,} nodes) is past what the planner "
                             f"takes (at most {MAX_GPUS:,}; the largest clusters built have about 200,000)")
        for tier in ("intra", "inter"):
            if not isinstance(getattr(self, tier), Link):
                raise ValueError(f"{tier} must be a Link(alpha_s, beta_s_per_byte), got {getattr(self, tier)!r}")

    @property
    def world_size(self) -> int:
        """Every GPU of every node."""
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Layout:
    """One way to split the job: data, tensor, pipeline and context parallel sizes, ZeRO stage, micro-batch size,
    full activation checkpointing or not, and expert parallelism (ep ranks borrowed from dp x cp, as
    :class:`labkit.comm.mesh.Mesh` defines it)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    zero: int = 0
    micro_batch: int = 1
    checkpointing: bool = False
    ep: int = 1
    v: int = 1                  # model chunks per pipeline rank: interleaved 1F1B when > 1 (Narayanan et al. 2021)
    zero_bubble: bool = False   # ZB-H1 (Qi et al. 2023): backward split into input and weight gradients

    def __post_init__(self) -> None:
        self.mesh                                    # noqa: B018 - the grid made (its degrees checked) once, here
        for key in ("micro_batch", "v"):
            positive_int(getattr(self, key), key)
        if self.zero not in ZERO_STAGES:
            raise ValueError(f"zero must be one of {ZERO_STAGES}, got {self.zero!r}")

    @cached_property
    def mesh(self) -> Mesh:
        """The layout's grid of ranks (:class:`labkit.comm.mesh.Mesh`): its degrees and ep's rule are checked when it
        is made, in ``__post_init__``, and trusted by everything after (the planner's rules, the runner's groups)."""
        return Mesh(dp=self.dp, pp=self.pp, cp=self.cp, tp=self.tp, ep=self.ep)

    @property
    def ranks(self) -> int:
        """dp x tp x pp x cp (ep borrows ranks, it adds none)."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def data_ranks(self) -> int:
        """dp x cp: the ranks that hold the same (dense) weights, so gradients are reduced and ZeRO shards over
        them (Megatron-LM's data-parallel group with context parallelism; FSDP's shard group)."""
        return self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """How many ranks hold the same experts: dp x cp / ep (their gradients and ZeRO shards span these)."""
        return max(1, self.dp * self.cp // self.ep)

    def micro_batches(self, model: ModelSpec) -> int:
        """Micro-batches per step on each pipeline: global batch / (dp x micro-batch)."""
        return model.global_batch // (self.dp * self.micro_batch)

    def stage_layers(self, model: ModelSpec) -> int:
        """Layers on the busiest pipeline stage: ceil(L / pp) (stages differ by at most one layer)."""
        return -(-model.layers // self.pp)

    def label(self) -> str:
        """e.g. 'dp2 tp4 pp1 cp1 zero1 mb1 ckpt', ' ep8' added when experts are split."""
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} zero{self.zero} mb{self.micro_batch}"
                + (" ckpt" if self.checkpointing else "") + (f" ep{self.ep}" if self.ep > 1 else "")
                + (f" v{self.v}" if self.v > 1 else "") + (" zb" if self.zero_bubble else ""))


def mesh_problem(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> str | None:
    """Why the mesh of ``layout`` (dp, tp, pp, cp, ep) cannot hold ``model`` on ``cluster``, or None. The
    divisibility rules are the mesh's (:meth:`labkit.comm.mesh.Mesh.model_problems`: heads and kv_heads over tp, the
    sequence over tp's sequence parallelism and cp's 2cp chunks only where those axes are > 1, experts over ep,
    stages may differ by a layer); the planner adds the GPU count and ep's need for experts."""
    if layout.ranks != cluster.world_size:
        return f"dp x tp x pp x cp = {layout.ranks}, the cluster has {cluster.world_size} GPUs"
    mesh = layout.mesh                              # degrees checked when the layout was made, trusted here
    if layout.ep > 1 and model.moe is None:
        return f"ep={layout.ep} splits experts and {model.name} is dense (no mixture of experts)"
    problems = mesh.model_problems(heads=model.heads, kv_heads=model.kv, layers=model.layers, seq_len=model.seq_len,
                                   batch=model.global_batch, experts=model.moe.experts if model.moe else None,
                                   uneven_layers=True)
    return problems[0] if problems else None


def schedule_problem(model: ModelSpec, layout: Layout) -> str | None:
    """Why the batch schedule or ZeRO stage of ``layout`` cannot run, or None: micro-batches must divide each
    replica's share, and ZeRO shards over data-parallel ranks."""
    if model.global_batch % (layout.dp * layout.micro_batch):
        return f"global batch {model.global_batch} is no multiple of dp x micro-batch"
    if layout.zero and layout.data_ranks == 1:
        return "ZeRO shards over the data-parallel ranks (dp x cp): needs dp x cp > 1"
    if layout.v > 1 and (layout.pp == 1 or model.layers % (layout.pp * layout.v)
                         or layout.micro_batches(model) % layout.pp):
        return (f"interleaving v={layout.v} needs pp > 1, layers divisible by pp x v and micro-batches by pp "
                "(Megatron-LM's interleaved schedule)")
    if layout.zero_bubble and (layout.pp == 1 or layout.v > 1):
        return "ZB-H1 is a schedule of pp > 1 with one chunk per rank (v = 1)"
    return None


def layout_problem(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> str | None:
    """Why ``layout`` cannot run ``model`` on ``cluster`` (one sentence), or None: its mesh, then its schedule."""
    return mesh_problem(model, cluster, layout) or schedule_problem(model, layout)


def memory_terms(model: ModelSpec, device: DeviceSpec, layout: Layout, selective: bool = True,
                 layer_bytes: float | None = None, layer_input_bytes: float | None = None) -> dict[str, float]:
    """Bytes on the busiest rank (the first pipeline stage, plus the output logits on the last), each term named.
    Routed experts and their gradients and optimizer state are divided by ep (and ZeRO-sharded over the dp x cp / ep
    ranks holding the same experts); the rest by ZeRO over dp x cp. ``layer_bytes`` / ``layer_input_bytes``: one layer's
    saved activations / its input on this rank where a model other than the paper's layer is planned (the kit's fp32
    layer without dropout, counted)."""
    split = layout.tp * layout.pp
    dense_local, expert_local = (model.num_params - model.expert_params) / split, model.expert_params / (split * layout.ep)
    f = sharding_factors(f"zero{layout.zero}" if layout.zero else "ddp", layout.data_ranks, fsdp_keeps_shard=False)
    fe = sharding_factors(f"zero{layout.zero}" if layout.zero else "ddp", layout.expert_dp, fsdp_keeps_shard=False)
    s, b, h = model.seq_len // layout.cp, layout.micro_batch, model.hidden
    dense, moe = (layer_activation_bytes(s, b, h, model.heads, model.kv, layout.tp, model.ffn, model.gated_ffn,
                                         model.moe, selective) if layer_bytes is None else (layer_bytes,) * 2)
    per_layer = (dense * (model.layers - model.moe_layers) + moe * model.moe_layers) / model.layers
    kept_input = device.param_bytes * s * b * h / layout.tp if layer_input_bytes is None else layer_input_bytes
    layers_kept = layout.stage_layers(model) * min(layout.pp, layout.micro_batches(model))
    if layout.v > 1:        # interleaving keeps (1 + (p-1)/(p v)) times more (Korthikanti et al. 2022, Sec. 4.2.3)
        layers_kept *= 1 + (layout.pp - 1) / (layout.pp * layout.v)
    kept = kept_input * layers_kept if layout.checkpointing else per_layer * layers_kept
    recomputed = max(dense, moe) if layout.checkpointing else 0.0

    def state(bytes_per_param: float, factor: str) -> float:
        return bytes_per_param * (dense_local * getattr(f, factor) + expert_local * getattr(fe, factor))
    return {"parameters": state(device.param_bytes, "params"), "gradients": state(device.param_bytes, "grads"),
            "optimizer state": state(device.optimizer_bytes_per_param, "optimizer"),
            "activations kept": kept, "one layer recomputed (backward)": recomputed,
            "output logits (fp32)": 4 * s * b * model.vocab / layout.tp if model.embedding else 0.0}
