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


def test_device_label_names_the_device_the_work_ran_on_not_the_default(monkeypatch):
    """On a GPU box (mocked) work done on the CPU is labelled CPU; the GPU's name only for work on the GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx: "NVIDIA H100 80GB HBM3")
    assert device.get_device().type == "cuda" and device.device_label() == "NVIDIA H100 80GB HBM3 (cuda:0)"
    ran_on = torch.nn.Linear(2, 2).weight.device                          # a model left on the CPU
    assert device.device_label(ran_on).startswith("CPU (") and "H100" not in device.device_label(ran_on)
