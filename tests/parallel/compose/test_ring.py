"""Ring attention over a cp group, as an autograd function: equal to full attention (output and q, k, v gradients)
on 2 real gloo ranks, where attending to one's own tokens only (the rival) is far off."""
from __future__ import annotations

import torch

from labkit.comm.launch import launch
from labkit.comm.mesh import Mesh, process_groups
from labkit.parallel.compose.ring import RingAttention, heads_first
from labkit.parallel.context.ring_attention import full_attention, zigzag_shard


def ring_against_full(seq_len: int) -> dict:
    """On a rank of 2: this rank's zig-zag share through RingAttention against the sharded full attention."""
    cp = process_groups(Mesh(cp=2))["cp"]
    gen = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(1, 2, seq_len, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    full_attention(q, k, v, causal=False).backward(d_out)
    mine = [zigzag_shard(t.detach(), 2, cp.index).requires_grad_() for t in (q, k, v)]
    out = RingAttention.apply(*mine, cp, seq_len)
    out.backward(zigzag_shard(d_out, 2, cp.index))
    expected = zigzag_shard(full_attention(q, k, v, causal=False).detach(), 2, cp.index)
    errors = {"out": float((out - expected).abs().max())}
    for name, shard, whole in zip("qkv", mine, (q, k, v)):
        errors[f"d{name}"] = float((shard.grad - zigzag_shard(whole.grad, 2, cp.index)).abs().max())
    local = full_attention(*(t.detach() for t in mine), causal=False)       # the rival: own tokens only
    errors["rival_out"] = float((local - expected).abs().max())
    return errors


def test_ring_attention_over_a_cp_group_equals_full_attention():
    for errors in launch(ring_against_full, 2, args=(16,), timeout_s=90, show_output=False, backend="gloo"):
        assert max(errors[k] for k in ("out", "dq", "dk", "dv")) < 1e-12, errors    # float64: rounding only
        assert errors["rival_out"] > 1e-2, errors


def test_heads_first_splits_the_hidden_width_into_heads():
    t = torch.arange(2 * 3 * 8.0).reshape(2, 3, 8)                                   # (b, s, n*hd), n=2, hd=4
    out = heads_first(t, 4)
    assert out.shape == (2, 2, 3, 4) and torch.equal(out[1, 1, 2], t[1, 2, 4:])
