"""The one precision table: aliases, math modes, bytes per element."""
import pytest
import torch

from labkit.training.dtypes import MATH_MODES, dtype_bytes, normalise_dtype


def test_normalise_dtype():
    assert normalise_dtype("bf16") == "bfloat16" and normalise_dtype(torch.float16) == "float16"
    assert normalise_dtype(None) == "float32"
    with pytest.raises(ValueError, match="unknown dtype"):
        normalise_dtype("fp8")


def test_math_modes_and_bytes():
    assert set(MATH_MODES) == {"fp32", "tf32", "bf16", "fp16"}
    assert dtype_bytes("bf16") == 2 and dtype_bytes(torch.float32) == 4
