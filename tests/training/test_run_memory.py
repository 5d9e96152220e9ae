"""A run in progress: the dashboard's predicted and measured memory, on a CPU and with mocked CUDA counters."""
from types import SimpleNamespace

import torch

from labkit.core.models import build_model
from labkit.memory.device import cuda_baseline_bytes
from labkit.training.run_memory import measure_run_memory, predict_run_memory
from labkit.training.run_spec import RunSpec


def _progress(model, inputs, optimizer="sgd", momentum=0.0):
    """The TrainProgress fields the run-memory functions read."""
    return SimpleNamespace(model=model, last_inputs=inputs, run=RunSpec(optimizer=optimizer, momentum=momentum))


def test_memory_follows_the_runs_optimizer_settings():
    """The prediction comes from the run's TrainProgress (optimizer, momentum, autocast), not hard-coded SGD."""
    model = build_model("mlp", 10, (3, 8, 8))
    inputs = torch.randn(4, 3, 8, 8)
    plain = predict_run_memory(_progress(model, inputs, "sgd", 0.0), 16)
    momentum = predict_run_memory(_progress(model, inputs, "sgd", 0.9), 16)
    adam = predict_run_memory(_progress(model, inputs, "adam", 0.0), 16)
    assert plain.optimizer_bytes == 0 and momentum.optimizer_bytes == plain.params_bytes
    assert adam.optimizer_bytes == 2 * plain.params_bytes


def test_run_memory_on_cpu_counts_activations_independently():
    torch.manual_seed(0)
    model = build_model("small_cnn", 10, (3, 8, 8))
    progress = _progress(model, torch.randn(16, 3, 8, 8), "sgd", 0.9)
    predicted = predict_run_memory(progress, 16)
    if not torch.cuda.is_available():
        assert cuda_baseline_bytes() is None
    measured = measure_run_memory(progress, predicted, baseline_bytes=None)
    assert measured >= predicted.params_bytes
    assert abs(measured - predicted.total_bytes) / predicted.total_bytes < 0.02
    assert all(p.grad is None for p in model.parameters())      # the count leaves the model as it was


def test_run_memory_on_a_gpu_is_the_peak_minus_the_baseline(monkeypatch):
    """Mocked CUDA counters: the run's bytes are the peak since the baseline, not what other cells hold."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 300_000_000)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 300_000_000 + 9_000)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 400_000_000)
    baseline = cuda_baseline_bytes()
    assert baseline == 300_000_000
    on_gpu = SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device("cuda"))]))
    assert measure_run_memory(_progress(on_gpu, None), None, baseline) == 9_000
