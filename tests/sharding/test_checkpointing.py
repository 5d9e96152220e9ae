"""Activation checkpointing: same outputs and gradients, predicted bytes match measured, fits a larger batch."""
import pytest
import torch
from torch import nn

from labkit.sharding import checkpointing


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()),
                         nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()), nn.Linear(64, 4))


def test_same_outputs_and_gradients():
    model, x = _model(), torch.randn(8, 16)
    ckpt = checkpointing.with_checkpointing(model, ["0", "1"])
    model(x).sum().backward()
    ckpt(x).sum().backward()
    for p, q in zip(model.parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_unknown_segment_is_a_clear_error():
    with pytest.raises(ValueError, match="no child module named"):
        checkpointing.with_checkpointing(_model(), ["layer9"])


@pytest.mark.parametrize("segments", [["0", "1"], ["1"]])
def test_prediction_matches_measurement(segments):
    model, x = _model(), torch.randn(32, 16)
    predicted = checkpointing.predict_checkpointed_bytes(model, x, segments)
    ckpt = checkpointing.with_checkpointing(model, segments)
    measured_plain = checkpointing.measure_forward_retained_bytes(model, x)
    measured_ckpt = checkpointing.measure_forward_retained_bytes(ckpt, x)
    assert predicted["checkpointed_bytes"] < predicted["plain_bytes"]
    assert measured_plain == pytest.approx(predicted["plain_bytes"], rel=0.05)
    assert measured_ckpt == pytest.approx(predicted["checkpointed_bytes"], rel=0.05)


def test_transformer_block_saves_most_activations():
    model, x = checkpointing.transformer_stack(d_model=32, heads=2, layers=2), torch.randn(2, 16, 32)
    predicted = checkpointing.predict_checkpointed_bytes(model, x, ["0", "1"])
    assert predicted["checkpointed_bytes"] * 4 < predicted["plain_bytes"]


def test_step_time_comparison_and_largest_batch():
    model, x = _model(), torch.randn(64, 16)
    times = checkpointing.compare_step_time(model, checkpointing.with_checkpointing(model, ["0", "1"]), x, repeats=3)
    assert times.plain_step_s > 0 and times.forward_s > 0 and times.predicted_added_fraction > 0
    assert checkpointing.largest_batch_within({1: 100, 2: 200}, 1000) == 10
    assert checkpointing.largest_batch_within({1: 100, 2: 200}, 1000, fixed_bytes=500) == 5
    with pytest.raises(ValueError, match="did not grow"):
        checkpointing.largest_batch_within({1: 100, 2: 100}, 1000)


def test_bytes_line_through_two_batches():
    assert checkpointing.bytes_line({4: 500, 2: 300}) == (100.0, 100.0)


def test_on_a_cpu_the_launch_time_is_the_step_and_the_work_sets_the_pace():
    model, x = _model(), torch.randn(64, 16)
    times = checkpointing.compare_step_time(model, checkpointing.with_checkpointing(model, ["0", "1"]), x, repeats=2)
    assert times.plain_launch_s == times.plain_step_s and times.launch_bound_fraction == 1.0
    assert checkpointing.pace(times, on_gpu=False) == "compute"


def test_the_pace_on_a_gpu_follows_the_hosts_launch_time():
    """The recorded H200 regimes (docs/gpu-report.md): a launch-bound small step, a compute-bound large one."""
    def comparison(step_ms, launch_ms):
        return checkpointing.StepTimeComparison(step_ms / 1e3, 2 * step_ms / 1e3, step_ms / 3e3,
                                                plain_launch_s=launch_ms / 1e3)

    assert checkpointing.pace(comparison(7.9, 7.6), on_gpu=True) == "launch"        # the GPU waited for launches
    assert checkpointing.pace(comparison(44.3, 8.0), on_gpu=True) == "compute"      # the host waited for the GPU
    assert checkpointing.pace(comparison(12.5, 8.0), on_gpu=True) == "mixed"        # neither clearly: not judged


def test_the_price_is_decided_from_paired_rounds_and_reports_their_spread():
    """A burst of load that slows one round's checkpointed step moves one pair, not the median of one side."""
    rounds = checkpointing.StepTimeComparison(1.0, 1.3, 0.33, ratio_by_round=(1.30, 1.32, 2.40, 1.28, 1.31),
                                              share_by_round=(0.33, 0.34, 0.30, 0.33, 0.32))
    assert rounds.time_added_fraction == pytest.approx(0.31)
    assert rounds.predicted_added_fraction == pytest.approx(0.33)
    assert 0.0 < rounds.spread < 1.0
    steady = checkpointing.StepTimeComparison(1.0, 1.3, 0.33, ratio_by_round=(1.3,) * 5, share_by_round=(0.33,) * 5)
    assert steady.spread == 0.0 and rounds.spread > steady.spread
    pairs = rounds.added_and_share_by_round                    # what the verdict compares round by round
    assert [a for a, _ in pairs] == pytest.approx([0.30, 0.32, 1.40, 0.28, 0.31])
    assert [s for _, s in pairs] == [0.33, 0.34, 0.30, 0.33, 0.32]
    faster = checkpointing.StepTimeComparison(1.0, 0.9, 0.3, ratio_by_round=(0.9,), share_by_round=(0.3,))
    assert faster.added_and_share_by_round == ((1e-3, 0.3),)   # a round the recompute did not slow stays positive


def test_without_rounds_the_price_is_the_medians_ratio():
    times = checkpointing.StepTimeComparison(2.0, 3.0, 0.5)
    assert times.time_added_fraction == pytest.approx(0.5) and times.predicted_added_fraction == pytest.approx(0.25)
    assert times.spread == 0.0


def test_compare_step_time_keeps_one_pair_per_timed_round():
    model, x = _model(), torch.randn(64, 16)
    times = checkpointing.compare_step_time(model, checkpointing.with_checkpointing(model, ["0", "1"]), x, repeats=3)
    assert len(times.ratio_by_round) == 3 == len(times.share_by_round)     # the warm-up round is dropped
    assert all(r > 0 for r in times.ratio_by_round) and times.spread >= 0.0
