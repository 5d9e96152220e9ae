"""The names the kit accepts: each list is what its builder really takes, and reading them loads no framework."""
import subprocess
import sys

import pytest
import torch

from labkit.core import choices
from labkit.core.data import resolve_dataset
from labkit.core.models import build_model
from labkit.memory.model import optimizer_kind


@pytest.mark.parametrize("name", choices.MODELS)
def test_every_model_name_builds(name):
    assert build_model(name, 10, (3, 32, 32)) is not None


def test_unknown_names_are_refused_by_the_builders():
    with pytest.raises(ValueError, match="choose one of"):
        build_model("vgg", 10, (3, 32, 32))
    with pytest.raises(ValueError, match=r"choose one of \('auto', 'cifar10', 'digits', 'synthetic'\)"):
        resolve_dataset("imagenet")


def test_every_optimizer_name_is_priced_by_the_memory_model():
    assert {optimizer_kind(name) for name in choices.OPTIMIZERS} == set(choices.OPTIMIZERS)


def test_benchmark_dtypes_are_element_sizes():
    for name, size in choices.COMM_DTYPES.items():
        assert torch.empty(0, dtype=getattr(torch, name)).element_size() == size


def test_the_lists_are_torch_free():
    """The CLI's parser offers these as choices; `labkit --help` must not load torch."""
    code = "import sys, labkit.core.choices; assert not {'torch', 'tensorflow'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
