"""Megatron's split by hand: the slices, the layer shape's errors, and one rank of one (the split is the layer)."""
import pytest
import torch

from labkit.parallel.tensor import megatron as tp


def test_a_column_split_takes_rows_of_the_weight_and_a_row_split_its_columns():
    w = torch.arange(24.0).reshape(4, 6)                 # nn.Linear: (out_features, in_features)
    assert torch.equal(tp.shard_tensor(w, tp.COLUMN, 1, 2), w[2:4])
    assert torch.equal(tp.shard_tensor(w, tp.ROW, 1, 2), w[:, 3:6])
    bias = torch.arange(4.0)
    assert torch.equal(tp.shard_tensor(bias, tp.COLUMN, 0, 2), bias[:2])
    assert torch.equal(tp.shard_tensor(bias, tp.ROW, 1, 2), bias)     # added once, after the sum
    with pytest.raises(ValueError, match="split must be"):
        tp.shard_tensor(w, "diagonal", 0, 2)


def test_the_shards_of_every_rank_put_together_are_the_unsplit_state():
    block = tp.build_block(tp.LayerShape(d_model=16, heads=4, seq_len=8, batch=2))
    full = dict(block.state_dict())
    parts = [tp.shard_state(full, r, 4) for r in range(4)]
    for name, tensor in full.items():
        module = name.rsplit(".", 1)[0]
        if tp.SPLITS.get(module) == tp.COLUMN:
            assert torch.equal(torch.cat([p[name] for p in parts], dim=0), tensor), name
        elif tp.SPLITS.get(module) == tp.ROW and tensor.dim() == 2:
            assert torch.equal(torch.cat([p[name] for p in parts], dim=1), tensor), name
        else:
            assert all(torch.equal(p[name], tensor) for p in parts), name


def test_layer_shape_says_what_does_not_divide():
    with pytest.raises(ValueError, match="divisible by heads"):
        tp.LayerShape(d_model=10, heads=4)
    with pytest.raises(ValueError, match=r"heads=4 must be divisible by tp=3 .*fix: tp in \[1, 2, 4\]"):
        tp.LayerShape().check_split(3)
    with pytest.raises(ValueError, match="batch"):
        tp.LayerShape(batch=0)


def test_attention_infers_its_heads_so_half_the_heads_give_half_the_output():
    shape = tp.LayerShape(d_model=16, heads=4, seq_len=8, batch=2)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 16) for _ in range(3))
    whole = tp.attend(q, k, v, head_dim=4)
    half = tp.attend(q[..., :8], k[..., :8], v[..., :8], head_dim=4)
    assert torch.allclose(whole[..., :8], half, atol=1e-6)
    assert shape.check_split(2) == 2


def test_the_block_is_a_residual_pre_norm_layer_with_the_kit_s_parameter_count():
    shape = tp.LayerShape()
    block = tp.build_block(shape)
    h = shape.d_model
    assert sum(p.numel() for p in block.parameters()) == 12 * h * h + 13 * h   # 4 attn + 2 MLP linears, 2 norms
    x = torch.randn(2, 8, h)
    assert block(x).shape == x.shape
