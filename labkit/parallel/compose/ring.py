"""Context parallelism inside the tensor-parallel layer: ring attention over one cp group, as an autograd function.

The block maths is :mod:`labkit.parallel.context.ring_attention` (Liu et al. 2023, arXiv:2310.01889; the online
softmax forward and FlashAttention's backward, by hand); this module passes the K/V blocks around the ranks of a
*cp group* (not the whole world, as :mod:`labkit.parallel.context.ring_runs` does), so it composes with tp on the
same grid: each rank holds its tp share of the heads and its zig-zag share of the sequence. Every position-wise
part of the layer (norms, linears, MLP) needs nothing more; only attention sees the whole sequence. The kit's layer
attends without a causal mask (notebook 13's ``Block``), so here the zig-zag split balances nothing; it keeps the
token layout a causal model needs, and the mesh's rule that the sequence divides by 2cp.

Traffic per rank per layer: forward, the K/V block (2 x b x n/t x s/c x d_head) passed on c-1 times; backward,
the block passed c-1 more times and its gradient accumulator c times (the last pass takes it home).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.comm.mesh import AxisGroup
from labkit.parallel.context.ring_attention import backward_block, forward_block, start_state, zigzag_positions
from labkit.parallel.tensor.megatron import ParallelBlock, enter_parallel

KV_TAG, GRAD_TAG = 11, 12


def _pass(block: torch.Tensor, cp: AxisGroup, tag: int) -> tuple[torch.Tensor, list]:
    """Send ``block`` to the next rank of the cp ring, receive the previous one's (non-blocking)."""
    recv = torch.empty_like(block)
    nxt, prev = cp.ranks[(cp.index + 1) % cp.size], cp.ranks[(cp.index - 1) % cp.size]
    return recv, [dist.isend(block.contiguous(), nxt, group=cp.group, tag=tag),
                  dist.irecv(recv, prev, group=cp.group, tag=tag)]


def _wait(reqs: list) -> None:
    for req in reqs:
        req.wait()


class RingAttention(torch.autograd.Function):
    """Non-causal attention of this rank's queries against the whole sequence's keys, the K/V going round the ring.
    q, k, v: (b, n, s/c, d_head), this rank's heads and zig-zag tokens."""

    @staticmethod
    def forward(ctx: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: AxisGroup,
                seq_len: int) -> torch.Tensor:
        """c steps: fold in the held block while the next one travels."""
        c, me = cp.size, cp.index
        mine, held, state = zigzag_positions(seq_len, c, me), torch.stack([k, v]), start_state(q)
        for step in range(c):
            recv, reqs = _pass(held, cp, KV_TAG) if step < c - 1 else (None, [])
            src = (me - step) % c
            forward_block(state, q, mine, held[0], held[1], zigzag_positions(seq_len, c, src), causal=False)
            _wait(reqs)
            held = recv if recv is not None else held
        ctx.save_for_backward(q, k, v, state.out, state.lse)
        ctx.cp, ctx.seq_len = cp, seq_len
        return state.out.clone()

    @staticmethod
    def backward(ctx: object, d_out: torch.Tensor) -> tuple:
        """The blocks go round again; each block's gradient travels behind it and ends at its owner."""
        q, k, v, out, lse = ctx.saved_tensors
        cp, seq_len = ctx.cp, ctx.seq_len
        c, me = cp.size, cp.index
        mine, held, dq = zigzag_positions(seq_len, c, me), torch.stack([k, v]), torch.zeros_like(q)
        grad_in = None
        for step in range(c):
            recv, reqs = _pass(held, cp, KV_TAG) if step < c - 1 else (None, [])
            src = (me - step) % c
            dkv = torch.zeros_like(held) if grad_in is None else grad_in
            backward_block(q, mine, held[0], held[1], zigzag_positions(seq_len, c, src), out, lse,
                           d_out.contiguous(), dq, dkv[0], dkv[1], causal=False)
            grad_in, grad_reqs = _pass(dkv, cp, GRAD_TAG)
            _wait(reqs + grad_reqs)
            held = recv if recv is not None else held
        return dq, grad_in[0], grad_in[1], None, None


def heads_first(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(b, s, n*hd) -> (b, n, s, hd)."""
    b, s = t.shape[:2]
    return t.reshape(b, s, -1, head_dim).transpose(1, 2)


def ring_block_forward(block: ParallelBlock, x: torch.Tensor, cp: AxisGroup, seq_len: int) -> torch.Tensor:
    """``ParallelBlock.forward`` with its attention run as ring attention over ``cp``: x is (b, s/c, h), this
    rank's zig-zag tokens; tp's f and g operators are the block's own."""
    a, m = block.attn, block.mlp
    q, k, v = enter_parallel(block.ln1(x), [a.wq, a.wk, a.wv], False, block.group)    # this rank's heads
    out = RingAttention.apply(*(heads_first(t, block.head_dim) for t in (q, k, v)), cp, seq_len)
    b, _, s, _ = out.shape
    x = x + a.wo(out.transpose(1, 2).reshape(b, s, -1))                              # g: one all-reduce over tp
    return x + m.fc2(F.gelu(m.fc1(block.ln2(x))))
