"""What the planner is told (a model, a device, a cluster) and what it predicts a rank holds, each term named.

Model state per rank follows ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, Section 3.1 and Figure 1):
mixed-precision Adam keeps 2 bytes of parameters, 2 of gradients and 12 of optimizer state (fp32 master, momentum,
variance) per parameter, and ZeRO stage 1/2/3 shards the last one, two or three over the data-parallel ranks
(:func:`labkit.sharding.memory.sharding_factors`). Tensor and pipeline parallelism split the parameters first.
Activations per layer are Korthikanti et al. 2022 (arXiv:2205.05198, Eq. 1-3) via
:func:`labkit.parallel.tensor.cost.korthikanti_bytes`, with sequence parallelism, on the rank's sequence share s/cp;
``selective`` (the default) drops the 5as^2b score term as their selective recomputation, or a fused/ring attention
kernel, does. With 1F1B the first stage keeps p micro-batches of L/p layers, i.e. L layers' worth (their Section
4.2.3). Full checkpointing keeps each layer's 2sbh input plus one layer recomputed (Chen et al. 2016).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from labkit.comm.two_tier import Link
from labkit.core.validation import positive_int, positive_number
from labkit.parallel.tensor.cost import korthikanti_bytes
from labkit.sharding.memory import sharding_factors
from labkit.training.flops import find_peak

GIB = 2**30
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
    """A GPT-style transformer: layers, hidden size, heads, sequence, vocabulary; the global batch in sequences."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    global_batch: int = 8
    name: str = "transformer"
    embedding: bool = True         # False: a bare stack of layers (no embeddings, no output logits)

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "seq_len", "vocab", "global_batch"):
            positive_int(getattr(self, key), key)
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.num_params > MAX_PARAMS:
            raise ValueError(f"a model of about {_magnitude(self.num_params)} parameters is past what the planner takes "
                             f"(at most {MAX_PARAMS:.0e}; the largest published have about 1e12): check layers, "
                             "hidden and vocab")
        if self.global_batch * self.seq_len > MAX_TOKENS_PER_STEP:
            raise ValueError(f"global_batch x seq_len = {_magnitude(self.global_batch * self.seq_len)} tokens per step is past "
                             f"what the planner takes (at most {MAX_TOKENS_PER_STEP:.0e})")

    @property
    def layer_params(self) -> int:
        """One layer: QKV + output projection 4h^2 + MLP 8h^2, biases and norms 13h (Narayanan et al. 2021)."""
        return 12 * self.hidden ** 2 + 13 * self.hidden

    @property
    def num_params(self) -> int:
        """All layers plus the (tied) token and learned position embeddings."""
        embeddings = (self.vocab + self.seq_len) * self.hidden if self.embedding else 0
        return self.layers * self.layer_params + embeddings

    def step_flops(self, recompute: bool = False) -> float:
        """Model FLOPs of one training step: 72 B s L h^2 (1 + s/6h + V/12Lh), 96 with full recomputation
        (Narayanan et al. 2021, arXiv:2104.04473, Eq. 3; its factor 4 forward passes instead of 3)."""
        b, s, l, h, v = self.global_batch, self.seq_len, self.layers, self.hidden, self.vocab
        head = v / (12 * l * h) if self.embedding else 0.0
        return (96 if recompute else 72) * b * s * l * h ** 2 * (1 + s / (6 * h) + head)


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: memory, the peak FLOP/s of the math mode used, the fraction of it training reaches."""

    name: str
    memory_bytes: float
    peak_flops_per_s: float
    efficiency: float = 0.4
    param_bytes: int = 2                 # bf16 weights and gradients
    optimizer_bytes_per_param: int = 12  # fp32 master + Adam's two moments

    def __post_init__(self) -> None:
        positive_number(self.memory_bytes, "memory_bytes")
        positive_number(self.peak_flops_per_s, "peak_flops_per_s")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency is a fraction of the peak (0 < e <= 1), got {self.efficiency}")

    @classmethod
    def from_table(cls, gpu: str, memory_gib: float, math_mode: str = "bf16", efficiency: float = 0.4) -> "DeviceSpec":
        """A GPU from the kit's one peak table (labkit.training.flops.PEAK_TABLE)."""
        spec = find_peak(gpu)
        if spec is None or math_mode not in spec.peak_flops_per_s:
            raise ValueError(f"no {math_mode} peak for {gpu!r} in labkit.training.flops.PEAK_TABLE")
        return cls(spec.name, memory_gib * GIB, spec.peak_flops_per_s[math_mode], efficiency)


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
    full activation checkpointing or not."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    zero: int = 0
    micro_batch: int = 1
    checkpointing: bool = False

    def __post_init__(self) -> None:
        for key in ("dp", "tp", "pp", "cp", "micro_batch"):
            positive_int(getattr(self, key), key)
        if self.zero not in ZERO_STAGES:
            raise ValueError(f"zero must be one of {ZERO_STAGES}, got {self.zero!r}")

    @property
    def ranks(self) -> int:
        """dp x tp x pp x cp."""
        return self.dp * self.tp * self.pp * self.cp

    def micro_batches(self, model: ModelSpec) -> int:
        """Micro-batches per step on each pipeline: global batch / (dp x micro-batch)."""
        return model.global_batch // (self.dp * self.micro_batch)

    def label(self) -> str:
        """e.g. 'dp2 tp4 pp1 cp1 zero1 mb1 ckpt'."""
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} zero{self.zero} mb{self.micro_batch}"
                + (" ckpt" if self.checkpointing else ""))


def layout_problem(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> str | None:
    """Why ``layout`` cannot run ``model`` on ``cluster`` (one sentence), or None."""
    checks = [(layout.ranks == cluster.world_size, f"dp x tp x pp x cp = {layout.ranks}, the cluster has "
                                                   f"{cluster.world_size} GPUs"),
              (model.heads % layout.tp == 0, f"{model.heads} heads do not split over tp={layout.tp}"),
              (model.layers % layout.pp == 0, f"{model.layers} layers do not split over pp={layout.pp}"),
              (layout.cp == 1 or model.seq_len % (2 * layout.cp) == 0,      # ring attention's 2 x cp chunks
               f"seq {model.seq_len} is no multiple of 2 x cp={layout.cp}"),
              (model.global_batch % (layout.dp * layout.micro_batch) == 0,
               f"global batch {model.global_batch} is no multiple of dp x micro-batch"),
              (layout.zero == 0 or layout.dp > 1, "ZeRO shards over data-parallel ranks: needs dp > 1")]
    return next((why for ok, why in checks if not ok), None)


def memory_terms(model: ModelSpec, device: DeviceSpec, layout: Layout, selective: bool = True,
                 layer_bytes: float | None = None, layer_input_bytes: float | None = None) -> dict[str, float]:
    """Bytes on the busiest rank (the first pipeline stage, plus the output logits on the last), each term named.
    ``layer_bytes`` / ``layer_input_bytes``: one layer's saved activations / its input on this rank where a model
    other than the paper's layer is planned (the kit's fp32 layer without dropout, counted)."""
    local = model.num_params / (layout.tp * layout.pp)
    f = sharding_factors(f"zero{layout.zero}" if layout.zero else "ddp", layout.dp, fsdp_keeps_shard=False)
    s, b, h, a = model.seq_len // layout.cp, layout.micro_batch, model.hidden, model.heads
    per_layer = korthikanti_bytes(s, b, h, a, layout.tp, sequence_parallel=True)
    if selective:
        per_layer -= 5 * a * s * s * b / layout.tp
    per_layer = per_layer if layer_bytes is None else layer_bytes
    kept_input = device.param_bytes * s * b * h / layout.tp if layer_input_bytes is None else layer_input_bytes
    layers_kept = model.layers // layout.pp * min(layout.pp, layout.micro_batches(model))
    kept = kept_input * layers_kept if layout.checkpointing else per_layer * layers_kept
    recomputed = per_layer if layout.checkpointing else 0.0
    return {"parameters": local * device.param_bytes * f.params, "gradients": local * device.param_bytes * f.grads,
            "optimizer state": local * device.optimizer_bytes_per_param * f.optimizer,
            "activations kept": kept, "one layer recomputed (backward)": recomputed,
            "output logits (fp32)": 4 * s * b * model.vocab / layout.tp if model.embedding else 0.0}
