"""The one precision table: every name a dtype goes by, the math mode it runs in, its torch dtype and bytes.

The training loop, the autocast measurements (:mod:`labkit.training.precision`), the FLOP/s peaks
(:mod:`labkit.training.flops`) and the memory model (:mod:`labkit.memory.model`) all read this table, so
'bf16', 'bfloat16' and ``torch.bfloat16`` mean the same thing everywhere. Autocast's low-precision dtypes
are bf16 and fp16 (Micikevicius et al. 2018, "Mixed Precision Training"); TF32 is not a storage dtype but
the tensor-core math mode of float32 tensors on Ampere and newer GPUs.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    """One precision: torch's name for it, the short math-mode name, its torch dtype and bytes per element."""

    name: str                       # torch's name: 'float32', 'tf32', 'bfloat16', 'float16'
    math_mode: str                  # the short name peaks and configs use: 'fp32', 'tf32', 'bf16', 'fp16'
    torch_dtype: torch.dtype        # what the tensors hold (TF32 math runs on float32 tensors)
    bytes_per_element: int
    aliases: tuple[str, ...]        # every (lower-case) name it answers to


PRECISIONS: tuple[Precision, ...] = (
    Precision("float32", "fp32", torch.float32, 4, ("fp32", "float32")),
    Precision("tf32", "tf32", torch.float32, 4, ("tf32",)),
    Precision("bfloat16", "bf16", torch.bfloat16, 2, ("bf16", "bfloat16")),
    Precision("float16", "fp16", torch.float16, 2, ("fp16", "float16", "half")),
)
MATH_MODES = tuple(p.math_mode for p in PRECISIONS)         # ('fp32', 'tf32', 'bf16', 'fp16')
AMP_DTYPES = ("bf16", "fp16")                                # what torch.autocast can run in
_BY_ALIAS = {alias: p for p in PRECISIONS for alias in p.aliases}


def precision_of(dtype: str | torch.dtype | None) -> Precision:
    """The table row for 'bf16', 'bfloat16', torch.bfloat16, ...; None means float32."""
    if dtype is None:
        return _BY_ALIAS["float32"]
    key = str(dtype).replace("torch.", "").lower()
    if key not in _BY_ALIAS:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_BY_ALIAS)}")
    return _BY_ALIAS[key]


def normalise_dtype(dtype: str | torch.dtype | None) -> str:
    """'bf16' / torch.bfloat16 -> 'bfloat16'; None -> 'float32'."""
    return precision_of(dtype).name


def math_mode_name(mode: str | torch.dtype | None) -> str:
    """'float32' / 'fp32' / None -> 'fp32'; torch.bfloat16 -> 'bf16'; 'tf32' -> 'tf32'."""
    return precision_of(mode).math_mode


def dtype_bytes(dtype: str | torch.dtype) -> int:
    """Bytes per element: 'float32' -> 4, 'bf16' -> 2."""
    return precision_of(dtype).bytes_per_element


def amp_torch_dtype(precision: str | torch.dtype | None) -> torch.dtype | None:
    """The dtype autocast runs in for ``precision`` ('bf16', 'fp16' or an alias); None for None or fp32."""
    try:
        p = precision_of(precision)
    except ValueError:
        raise ValueError(f"precision must be None or one of {AMP_DTYPES} (or a name of them: 'bfloat16', "
                         f"'float16', 'half', torch.bfloat16, ...), got {precision!r}") from None
    if p.math_mode == "fp32":
        return None
    if p.math_mode not in AMP_DTYPES:
        raise ValueError(f"precision must be None or one of {AMP_DTYPES}, got {precision!r} ({p.name} is the "
                         "math mode of float32 tensors, not a dtype autocast runs in)")
    return p.torch_dtype


def amp_mode(precision: str | torch.dtype | None) -> str | None:
    """The one spelling of an autocast choice: None for fp32 (or None), else 'bf16' or 'fp16'; anything else raises."""
    return None if amp_torch_dtype(precision) is None else precision_of(precision).math_mode


def autocast(device_type: str, precision: str | torch.dtype | None) -> contextlib.AbstractContextManager[None]:
    """``torch.autocast`` for ``precision`` on ``device_type`` ('cpu', 'cuda'), or a do-nothing context for fp32."""
    dtype = amp_torch_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)
