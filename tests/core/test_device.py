"""Which device the kit trains on, and its printed name (no GPU needed: CUDA is absent or mocked)."""
import pytest
import torch

from labkit.core import device


def test_get_device_cpu_and_bad_cuda():
    assert device.get_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            device.get_device("cuda")
        assert device.gpu_info() == [] and device.nccl_available() is False


def test_device_label_names_the_cpu_and_its_threads():
    assert "CPU" in device.device_label("cpu") and "torch threads" in device.device_label("cpu")
