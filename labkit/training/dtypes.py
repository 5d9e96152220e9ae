"""Precision names in one place: dtype aliases, the math mode each runs in, and bytes per element.

The FLOP/s peaks (:mod:`labkit.training.flops`) and the memory model (:mod:`labkit.training.memory`) both
read this table, so 'bf16', 'bfloat16' and ``torch.bfloat16`` mean the same thing everywhere.
"""
from __future__ import annotations

import torch

MATH_MODES = ("fp32", "tf32", "bf16", "fp16")
_DTYPE_ALIASES = {"fp32": "float32", "float32": "float32", "tf32": "tf32", "bf16": "bfloat16",
                  "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16"}
_MODE_OF_DTYPE = {"float32": "fp32", "tf32": "tf32", "bfloat16": "bf16", "float16": "fp16"}


def normalise_dtype(dtype: str | torch.dtype | None) -> str:
    """'bf16' / torch.bfloat16 -> 'bfloat16'; None -> 'float32'."""
    if dtype is None:
        return "float32"
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(set(_DTYPE_ALIASES))}")
    return _DTYPE_ALIASES[key]


def math_mode_name(mode: str | torch.dtype | None) -> str:
    """'float32' / 'fp32' / None -> 'fp32'; torch.bfloat16 -> 'bf16'; 'tf32' -> 'tf32'."""
    return _MODE_OF_DTYPE[normalise_dtype(mode)]


def dtype_bytes(dtype: str | torch.dtype) -> int:
    """Bytes per element: 'float32' -> 4, 'bf16' -> 2."""
    return {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2}[normalise_dtype(dtype)]
