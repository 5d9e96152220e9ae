"""Meta-device counts of a transformer LM: bound a real CPU block from above, scale with layers, give forward time."""
import pytest
import torch

from labkit.sharding import checkpointing, lm_footprint


def test_meta_count_matches_a_real_block():
    fp = lm_footprint.transformer_lm_footprint(d_model=64, heads=4, layers=1, seq_len=32, micro_batch=2, dtype="fp32")
    block = checkpointing.transformer_stack(d_model=64, heads=4, layers=1)
    x = torch.randn(2, 32, 64)
    assert fp.num_params == sum(p.numel() for p in block.parameters())
    real = checkpointing.predict_checkpointed_bytes(block, x, ["0"])["plain_bytes"]
    assert real <= fp.activation_bytes <= 1.25 * real, (fp.activation_bytes, real)   # an upper bound, see module doc


def test_layers_scale_and_checkpointing_keeps_inputs_plus_one_block():
    one = lm_footprint.transformer_lm_footprint(64, 4, 1, 32)
    eight = lm_footprint.transformer_lm_footprint(64, 4, 8, 32)
    assert eight.num_params == 8 * one.num_params and eight.activation_bytes == 8 * one.activation_bytes
    assert eight.forward_flops == 8 * one.forward_flops > 0
    assert eight.checkpointed_activation_bytes == 8 * 32 * 64 * 2 + one.activation_bytes
    assert eight.checkpointed_fraction < one.checkpointed_fraction


def test_forward_seconds_uses_the_datasheet_peak():
    assert lm_footprint.forward_seconds(989.5e12 * 0.5, "NVIDIA H100 SXM", mfu=0.5) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no bf16 peak for 'NVIDIA T4'"):
        lm_footprint.forward_seconds(1e12, "NVIDIA T4")
    with pytest.raises(ValueError, match="mfu is a fraction"):
        lm_footprint.forward_seconds(1e12, mfu=2.0)


def test_count_forward_flops_of_a_linear():
    model = torch.nn.Linear(10, 20)
    assert lm_footprint.count_forward_flops(model, (10,), 4) == 2 * 4 * 10 * 20


def test_bad_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="d_model=65 must be divisible by heads=4"):
        lm_footprint.transformer_lm_footprint(65, 4, 1, 8)
