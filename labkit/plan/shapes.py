"""The layer shapes people train today, counted: grouped-query attention, a gated (SwiGLU) feed-forward, and a
mixture of experts; parameters, matmul parameters a token uses, and activation bytes, per layer.

- Grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245): ``kv_heads`` K/V heads shared by the query
  heads; the K and V projections hold h x (h kv_heads / heads) each instead of h x h, and K/V activations shrink
  by the same factor heads / kv_heads.
- SwiGLU (Shazeer 2020, arXiv:2002.05202): three matrices h x F (gate, up, down) instead of two, F its own size.
- Mixture of experts (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; DeepSeekMoE, Dai et al. 2024,
  arXiv:2401.06066 for shared experts): ``experts`` routed FFNs of size ``expert_ffn`` of which a token uses
  ``top_k``, plus ``shared_experts`` every token uses, and a router (h x experts); an MoE layer every ``every``-th
  layer after ``first_dense`` dense ones (DeepSeek-V3 keeps its first 3 layers dense).
Activation bytes follow Korthikanti et al. 2022 (16-bit values): the paper's GELU MLP keeps its GELU input and fc2
input, 2 x 2sbF bytes; a SwiGLU keeps the gate and up outputs, the SiLU output and their product, 4 x 2sbF.
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit.core.validation import positive_int
from labkit.parallel.tensor.cost import korthikanti_bytes


@dataclass(frozen=True)
class MoESpec:
    """A mixture of experts: routed experts, top-k, each expert's FFN size, always-on shared experts, and where."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    every: int = 1            # an MoE layer every n-th layer (1: every layer; 2: GShard/Switch's every other)
    first_dense: int = 0      # leading dense layers before the first MoE layer (DeepSeek-V3: 3)

    def __post_init__(self) -> None:
        for key in ("experts", "top_k", "expert_ffn", "every"):
            positive_int(getattr(self, key), key)
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} must be at most experts={self.experts}: a token picks k of them")
        for key in ("shared_experts", "first_dense"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 0:
                raise ValueError(f"{key} must be an int >= 0, got {getattr(self, key)!r}")

    def moe_layers(self, layers: int) -> int:
        """How many of ``layers`` are MoE layers: every ``every``-th after the first ``first_dense``."""
        return max(0, layers - self.first_dense) // self.every


def attention_params(hidden: int, heads: int, kv_heads: int, biases: bool) -> int:
    """Q and output projections h x h, K and V h x (h kv_heads / heads) each, their biases if any."""
    kv_dim = hidden // heads * kv_heads
    return 2 * hidden * hidden + 2 * hidden * kv_dim + ((2 * hidden + 2 * kv_dim) if biases else 0)


def attention_matmul_params(hidden: int, heads: int, kv_heads: int) -> int:
    """The attention's weight matrices only (what 2 FLOPs per parameter per token multiply)."""
    return attention_params(hidden, heads, kv_heads, biases=False)


def ffn_params(hidden: int, ffn: int, gated: bool, biases: bool) -> int:
    """Two matrices h x F (GELU) or three (SwiGLU), and their biases if any."""
    matrices = (3 if gated else 2) * hidden * ffn
    return matrices + (((2 if gated else 1) * ffn + hidden) if biases else 0)


def norm_params(hidden: int, biases: bool) -> int:
    """A layer's two norms: LayerNorm (weight and bias, 4h) with biases, RMSNorm (weight, 2h) without."""
    return (4 if biases else 2) * hidden


def moe_ffn_params(hidden: int, moe: MoESpec, gated: bool, biases: bool, used_only: bool = False) -> int:
    """An MoE layer's FFN part: routed experts (all, or the top-k a token uses), shared experts, the router."""
    routed = moe.top_k if used_only else moe.experts
    one = ffn_params(hidden, moe.expert_ffn, gated, biases)
    return (routed + moe.shared_experts) * one + hidden * moe.experts + (moe.experts if biases else 0)


def routed_expert_params(hidden: int, moe: MoESpec, gated: bool, biases: bool) -> int:
    """One MoE layer's routed experts: the part expert parallelism divides (shared experts and router stay)."""
    return moe.experts * ffn_params(hidden, moe.expert_ffn, gated, biases)


def ffn_activation_bytes(seq: int, batch: int, ffn: int, gated: bool) -> float:
    """Bytes an FFN keeps for backward beyond its input: GELU 2 x 2sbF, SwiGLU 4 x 2sbF (16-bit)."""
    return (4 if gated else 2) * 2 * seq * batch * ffn


def moe_extra_activation_bytes(seq: int, batch: int, hidden: int, moe: MoESpec, gated: bool) -> float:
    """An MoE layer's FFN activations: k dispatched copies of each token (2sbh each) and each used expert's
    intermediates, plus the shared experts' and the router's fp32 probabilities (4 sb experts)."""
    per_expert = ffn_activation_bytes(seq, batch, moe.expert_ffn, gated)
    return moe.top_k * (2 * seq * batch * hidden + per_expert) + moe.shared_experts * per_expert \
        + 4 * seq * batch * moe.experts


def layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int, kv_heads: int, tp: int, ffn: int,
                           gated: bool, moe: MoESpec | None, selective: bool) -> tuple[float, float]:
    """(dense layer, MoE layer) activation bytes on one rank of ``seq`` tokens: Korthikanti et al.'s GPT layer with
    tensor + sequence parallelism (less the 5as^2b scores when ``selective``), K/V shrunk by heads/kv_heads, and the
    paper's 4h GELU intermediates replaced by this FFN (or by the experts' dispatched copies and intermediates)."""
    s, b, h, t = seq, batch, hidden, tp
    base = korthikanti_bytes(s, b, h, heads, t, sequence_parallel=True) - (5 * heads * s * s * b / t if selective else 0)
    base -= (ffn_activation_bytes(s, b, 4 * h, gated=False) + 4 * s * b * h * (1 - kv_heads / heads)) / t
    dense = base + ffn_activation_bytes(s, b, ffn, gated) / t
    return dense, (base + moe_extra_activation_bytes(s, b, h, moe, gated) / t if moe else dense)
