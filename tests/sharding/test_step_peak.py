"""Step peaks with and without checkpointing: measured in a fresh process, repeatable, checkpointing lowers them."""
import pytest
import torch

from labkit.memory.host import host_peak_unavailable
from labkit.sharding import step_peak


@pytest.mark.skipif(host_peak_unavailable() is not None, reason=str(host_peak_unavailable()))
def test_transformer_step_peaks_in_a_fresh_process():
    # notebook 11's fast shape. At seq_len 64, d_model 32 a step's activations were ~3 MB, the same order as the
    # pages a step faults in anyway: checkpointing's fit ranged 96-184 against plain's 90-101 and once lost
    # (92 vs 98, make test-busy). Here the peaks repeat to 0.1 MB: plain 7.6 / 29.6 MB, checkpointed 3.8 / 12.2.
    peaks = step_peak.measure_step_peaks("transformer", (4, 16), seq_len=128, d_model=64, layers=4)
    plain, ckpt = peaks["plain"], peaks["checkpointed"]
    assert plain[16] > plain[4] > 0 and ckpt[16] > ckpt[4] > 0
    assert ckpt[16] < plain[16]
    fits = step_peak.largest_batches(peaks, budget_bytes=300 * 10**6, fixed_bytes=10**6)
    assert fits["checkpointed"] > 1.5 * fits["plain"] > 0


def test_step_peak_counts_gradients_and_activations_in_process():
    if host_peak_unavailable() is not None:
        pytest.skip(host_peak_unavailable())
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
    x = torch.randn(256, 512)
    grads = sum(p.numel() * 4 for p in model.parameters())
    assert step_peak.measure_step_peak_bytes(model, x) >= grads


def test_unknown_workload_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown workload 'gpt'; choose one of"):
        step_peak.measure_step_peaks("gpt", (2, 4))
    with pytest.raises(ValueError, match="unknown workload"):
        step_peak.build_workload("gpt")


def test_per_sample_ratio_is_the_ratio_of_the_two_lines():
    peaks = {"plain": {2: 1_000, 6: 5_000}, "checkpointed": {2: 900, 6: 2_900}}
    assert step_peak.per_sample_ratio(peaks) == 0.5
    assert step_peak.largest_batches(peaks, budget_bytes=10_000, fixed_bytes=0) == {"plain": 11, "checkpointed": 20}
