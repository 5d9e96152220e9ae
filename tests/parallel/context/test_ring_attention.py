"""Ring attention's maths in one process: equal to full attention and its autograd gradients, the zig-zag split
balanced, the memory formula's terms."""
import pytest
import torch

from labkit.parallel.context.ring_attention import (causal_pairs_per_rank, full_attention, full_attention_peak_bytes,
                                            ring_attention_simulated, ring_peak_bytes, zigzag_positions,
                                            zigzag_shard, zigzag_unshard)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_the_ring_gives_full_attention_and_its_gradients(world_size, causal):
    gen = torch.Generator().manual_seed(world_size)
    q, k, v = (torch.randn(2, 3, 24, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    d_out = torch.randn(2, 3, 24, 8, generator=gen, dtype=torch.float64)
    ref = full_attention(q, k, v, causal)
    grads = torch.autograd.grad(ref, (q, k, v), d_out)
    got = ring_attention_simulated(q.detach(), k.detach(), v.detach(), d_out, world_size, causal)
    for a, b in zip(got, (ref, *grads)):
        torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12)


def test_a_wrong_block_order_is_caught():
    """The check can fail: a ring that skipped its last step would not equal full attention."""
    q, k, v, d = (torch.randn(1, 1, 16, 4, dtype=torch.float64) for _ in range(4))
    out = ring_attention_simulated(q, k, v, d, 2, causal=False)[0]
    half = ring_attention_simulated(q[..., :8, :], k[..., :8, :], v[..., :8, :], d[..., :8, :], 1, False)[0]
    assert not torch.allclose(out[..., :8, :], half)


def test_zigzag_shards_round_trip_and_balance_causal_work():
    x = torch.arange(32.0).reshape(1, 32, 1)
    shards = [zigzag_shard(x, 4, r) for r in range(4)]
    assert zigzag_positions(32, 4, 1).tolist() == [4, 5, 6, 7, 24, 25, 26, 27]
    assert torch.equal(zigzag_unshard(shards, 32), x)
    zig, flat = causal_pairs_per_rank(64, 4), causal_pairs_per_rank(64, 4, "contiguous")
    assert len(set(zig)) == 1 and sum(zig) == sum(flat) == 64 * 65 // 2
    assert max(flat) / min(flat) > 6


def test_bad_input_gets_one_clear_message():
    with pytest.raises(ValueError, match="multiple of 2 x world_size"):
        zigzag_positions(30, 4, 0)
    with pytest.raises(ValueError, match="rank must be"):
        zigzag_positions(32, 4, 4)
    with pytest.raises(ValueError, match="split must be"):
        causal_pairs_per_rank(32, 4, "striped")


def test_the_ring_keeps_a_w_th_of_the_sequence_and_no_s_by_s_scores():
    ring, full = ring_peak_bytes(1, 2, 8192, 64, 8), full_attention_peak_bytes(1, 2, 8192, 64)
    assert ring["output shard"] * 8 == full["Q, K, V, O"] // 4
    assert sum(ring.values()) < sum(full.values()) / 50
