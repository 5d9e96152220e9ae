"""A transformer language model's parameters, activations and forward FLOPs, counted without any memory.

The decision table needs these for models far larger than a laptop holds, so one block is built on PyTorch's
``meta`` device (shapes and dtypes, no storage) and run once: a saved-tensors hook adds up the distinct
storages autograd keeps for backward, and ``torch.utils.flop_counter.FlopCounterMode`` counts the forward's
FLOPs. Both are multiplied by the number of blocks (embeddings and the output head are left out: they add
vocab x d_model parameters). With every block checkpointed (Chen et al. 2016) a rank keeps each block's input
plus, during backward, one block's recomputed activations. On ``meta`` attention runs PyTorch's reference kernel, which saves the s x s score
matrices; the fused kernels PyTorch runs on CPU and GPU (FlashAttention, Dao et al. 2022, arXiv:2205.14135)
keep one fp32 log-sum-exp per row instead, so the count drops the scores and adds that. The reference kernel
also saves a transposed key and a weight copy that the fused path does not, so the count is an upper bound: the
tests hold it between 1.0x and 1.25x of a real block's saved bytes on CPU (1.18x at d_model 64).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from labkit.core.validation import positive_int, positive_number
from labkit.core.dtypes import precision_of
from labkit.memory.saved import SavedStorages, watch_saved
from labkit.training.flops import find_peak


@dataclass(frozen=True)
class LMFootprint:
    """One rank's share of a transformer LM at one micro-batch, in bytes and FLOPs."""

    name: str
    num_params: int
    activation_bytes: int               # kept for backward by all blocks, no checkpointing
    checkpointed_activation_bytes: int  # every block checkpointed: block inputs + one block recomputed
    forward_flops: float                # one forward of the micro-batch

    @property
    def checkpointed_fraction(self) -> float:
        """Checkpointed activations / plain activations."""
        return self.checkpointed_activation_bytes / self.activation_bytes


def transformer_lm_footprint(d_model: int, heads: int, layers: int, seq_len: int, micro_batch: int = 1,
                             dtype: str = "bf16") -> LMFootprint:
    """Count one pre-norm block (as ``checkpointing.transformer_stack``) on the meta device, times ``layers``."""
    for value, name in ((d_model, "d_model"), (heads, "heads"), (layers, "layers"), (seq_len, "seq_len"),
                        (micro_batch, "micro_batch")):
        positive_int(value, name)
    if d_model % heads:
        raise ValueError(f"d_model={d_model} must be divisible by heads={heads}")
    dt = precision_of(dtype).torch_dtype
    with torch.device("meta"):
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True, dtype=dt)
        x = torch.randn(micro_batch, seq_len, d_model, dtype=dt)
    saved = SavedStorages(exclude=[*block.parameters(), x])

    def on_save(t: torch.Tensor) -> None:
        if not (t.dim() >= 3 and t.shape[-1] == t.shape[-2] == seq_len):    # not the (batch, heads, s, s) scores
            saved.on_save(t)

    block.train()
    with watch_saved(on_save), FlopCounterMode(display=False) as counter:
        block(x)
    per_block = saved.total_bytes + micro_batch * heads * seq_len * 4      # + a fused kernel's fp32 log-sum-exp
    block_input = x.numel() * x.element_size()
    params = sum(p.numel() for p in block.parameters()) * layers
    return LMFootprint(name=f"{layers} x d{d_model} LM ({params / 1e9:.1f} B)", num_params=params,
                       activation_bytes=per_block * layers,
                       checkpointed_activation_bytes=block_input * layers + per_block,
                       forward_flops=float(counter.get_total_flops()) * layers)


def forward_seconds(forward_flops: float, gpu: str = "NVIDIA H100 SXM", mfu: float = 0.4,
                    math_mode: str = "bf16") -> float:
    """Seconds for ``forward_flops`` on ``gpu`` at the datasheet peak of ``math_mode`` times ``mfu``."""
    positive_number(mfu, "mfu")
    if mfu > 1:
        raise ValueError(f"mfu is a fraction of the peak (0 < mfu <= 1), got {mfu}")
    spec = find_peak(gpu)
    if spec is None or math_mode not in spec.peak_flops_per_s:
        raise ValueError(f"no {math_mode} peak for {gpu!r} in labkit.training.flops.PEAK_TABLE")
    return forward_flops / (spec.peak_flops_per_s[math_mode] * mfu)


def count_forward_flops(model: nn.Module, sample_shape: tuple[int, ...], batch_size: int) -> float:
    """FLOPs of one training-mode forward of ``model`` at ``batch_size``, counted on a meta-device copy."""
    positive_int(batch_size, "batch_size")
    meta = copy.deepcopy(model).to("meta").train()
    with FlopCounterMode(display=False) as counter:
        meta(torch.empty(batch_size, *sample_shape, device="meta"))
    return float(counter.get_total_flops())
