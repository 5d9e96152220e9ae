"""The one precision table: aliases, math modes, bytes per element."""
import pytest
import torch

from labkit.core.dtypes import (AMP_DTYPES, MATH_MODES, PRECISIONS, amp_torch_dtype, autocast, dtype_bytes,
                                    math_mode_name, normalise_dtype, precision_of)
from labkit.training.config import TrainConfig
from labkit.training.run_spec import RunSpec
from labkit.training.precision import DTYPES


def test_normalise_dtype():
    assert normalise_dtype("bf16") == "bfloat16" and normalise_dtype(torch.float16) == "float16"
    assert normalise_dtype(None) == "float32"
    with pytest.raises(ValueError, match="unknown dtype"):
        normalise_dtype("fp8")


def test_math_modes_and_bytes():
    assert set(MATH_MODES) == {"fp32", "tf32", "bf16", "fp16"}
    assert dtype_bytes("bf16") == 2 and dtype_bytes(torch.float32) == 4


def test_every_alias_of_a_precision_agrees():
    for p in PRECISIONS:
        for alias in p.aliases:
            assert precision_of(alias) is p and precision_of(alias.upper()) is p
        assert dtype_bytes(p.name) == p.torch_dtype.itemsize and math_mode_name(p.name) == p.math_mode
    assert precision_of(torch.bfloat16).math_mode == "bf16" and precision_of(None).name == "float32"


def test_autocast_from_the_table():
    assert AMP_DTYPES == ("bf16", "fp16")
    assert amp_torch_dtype("bf16") is torch.bfloat16 and amp_torch_dtype("half") is torch.float16
    assert amp_torch_dtype(None) is None and amp_torch_dtype("fp32") is None
    with pytest.raises(ValueError, match="not a dtype autocast runs in"):
        amp_torch_dtype("tf32")
    with autocast("cpu", None):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with autocast("cpu", "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_config_and_autocast_step_accept_the_tables_dtypes():
    assert all(TrainConfig(steps=1, run=RunSpec(precision=name)).spec.precision == name for name in AMP_DTYPES)
    assert DTYPES == ("fp32", *AMP_DTYPES)
