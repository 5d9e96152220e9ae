"""Context parallelism by hand: ring attention's block maths, the zig-zag split, and what one rank holds.

Ring attention (Liu, Zaharia & Abbeel 2023, arXiv:2310.01889) splits the *sequence* over W ranks: each keeps its
queries and passes its key/value block around a ring, so after W steps every query has met every key, while no
rank ever holds more than two blocks of K/V or one block of scores. Blocks are combined exactly with the online
softmax (Milakov & Gimelshein 2018, arXiv:1805.02867): each keeps a running output and a running log-sum-exp
(lse) per row, as FlashAttention does (Dao et al. 2022, arXiv:2205.14135). The backward pass is FlashAttention's
by hand: P = exp(S - lse), dV += P^T dO, dS = P (dO V^T - D) with D = rowsum(dO * O), dQ += dS K, dK += dS^T Q.

Causal attention gives the rank holding the sequence's end W times the work of the first rank if it is cut into W
contiguous pieces. The zig-zag split (as in Megatron-LM's context parallelism and Brandon et al. 2023,
arXiv:2311.09431) cuts it into 2W chunks and gives rank r chunks r and 2W-1-r, so every rank has the same number of
unmasked (query, key) pairs. This module is the maths, testable in one process; :mod:`labkit.parallel.context.ring_runs`
runs it on real ranks. Shapes: (batch, heads, tokens, head_dim) throughout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from labkit.core.validation import positive_int


def zigzag_chunks(world_size: int, rank: int) -> tuple[int, int]:
    """The two chunk ids (of 2W) that rank ``rank`` holds: r and 2W-1-r."""
    w = positive_int(world_size, "world_size")
    if not 0 <= rank < w:
        raise ValueError(f"rank must be in [0, {w}), got {rank}")
    return rank, 2 * w - 1 - rank


def zigzag_positions(seq_len: int, world_size: int, rank: int) -> torch.Tensor:
    """The global token positions this rank holds, in its local order (chunk r, then chunk 2W-1-r)."""
    chunk = _chunk_len(seq_len, world_size)
    a, b = zigzag_chunks(world_size, rank)
    return torch.cat([torch.arange(a * chunk, (a + 1) * chunk), torch.arange(b * chunk, (b + 1) * chunk)])


def zigzag_shard(x: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    """This rank's tokens of ``x`` (..., seq, d): chunks r and 2W-1-r along the sequence."""
    return x[..., zigzag_positions(x.shape[-2], world_size, rank), :].contiguous()


def zigzag_unshard(shards: list[torch.Tensor], seq_len: int) -> torch.Tensor:
    """Put every rank's shard back in sequence order (the inverse of :func:`zigzag_shard`)."""
    w = len(shards)
    out = shards[0].new_empty(*shards[0].shape[:-2], seq_len, shards[0].shape[-1])
    for r, shard in enumerate(shards):
        out[..., zigzag_positions(seq_len, w, r), :] = shard
    return out


def _chunk_len(seq_len: int, world_size: int) -> int:
    seq_len, w = positive_int(seq_len, "seq_len"), positive_int(world_size, "world_size")
    if seq_len % (2 * w):
        raise ValueError(f"seq_len={seq_len} must be a multiple of 2 x world_size = {2 * w} for the zig-zag split")
    return seq_len // (2 * w)


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """The reference: softmax(Q K^T / sqrt(d) + mask) V over the whole sequence, scores materialised."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[-2]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _pair_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None | bool:
    """None: every pair visible; False: none is (skip the block); else the (q, k) boolean 'hidden' mask."""
    if k_pos[-1] <= q_pos[0]:
        return None
    if k_pos[0] > q_pos[-1]:
        return False
    return k_pos[None, :] > q_pos[:, None]


def _pieces(pos: torch.Tensor, causal: bool) -> list[slice]:
    """The local chunks as slices: causal blocks are handled chunk by chunk so fully hidden pairs are skipped."""
    if not causal:
        return [slice(0, len(pos))]
    half = len(pos) // 2
    return [slice(0, half), slice(half, len(pos))]


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    """Q K^T * scale with hidden pairs at -inf, built in one buffer."""
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    return s if mask is None else s.masked_fill_(mask, float("-inf"))


@dataclass
class RingState:
    """A rank's running forward result: output (normalised so far) and each row's log-sum-exp."""

    out: torch.Tensor
    lse: torch.Tensor          # (batch, heads, tokens)


def start_state(q: torch.Tensor) -> RingState:
    """Nothing seen yet: output 0, lse -inf."""
    return RingState(torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype))


def forward_block(state: RingState, q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  k_pos: torch.Tensor, causal: bool = True) -> int:
    """Fold one K/V block into ``state`` with the online softmax; returns the (query, key) pairs computed."""
    scale, pairs = 1.0 / math.sqrt(q.shape[-1]), 0
    for qs in _pieces(q_pos, causal):
        for ks in _pieces(k_pos, causal):
            mask = _pair_mask(q_pos[qs], k_pos[ks]) if causal else None
            if mask is False:
                continue
            s = _scores(q[..., qs, :], k[..., ks, :], scale, mask)           # (b, h, cq, ck)
            row_max = s.amax(dim=-1)                                        # every row sees >= 1 key
            row_sum = s.sub_(row_max[..., None]).exp_().sum(dim=-1)          # in place: one score block alive
            block_out = (s @ v[..., ks, :]).div_(row_sum[..., None])
            block_lse = row_max + row_sum.log()
            del s                                                           # before the next pair's scores
            new_lse = torch.logaddexp(state.lse[..., qs], block_lse)
            old = torch.exp(state.lse[..., qs] - new_lse).nan_to_num(0.0)[..., None]
            state.out[..., qs, :] = state.out[..., qs, :] * old + block_out * torch.exp(block_lse - new_lse)[..., None]
            state.lse[..., qs] = new_lse
            pairs += block_out.shape[-2] * (ks.stop - ks.start) if mask is None else int((~mask).sum())
    return pairs


def backward_block(q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pos: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor,
                   dv: torch.Tensor, causal: bool = True) -> None:
    """Add one K/V block's share of the gradients into dq (this rank's) and dk, dv (the block's, travelling)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = (d_out * out).sum(-1)                                           # D = rowsum(dO * O)
    for qs in _pieces(q_pos, causal):
        for ks in _pieces(k_pos, causal):
            mask = _pair_mask(q_pos[qs], k_pos[ks]) if causal else None
            if mask is False:
                continue
            p = _scores(q[..., qs, :], k[..., ks, :], scale, mask).sub_(lse[..., qs, None]).exp_()   # weights
            dv[..., ks, :] += p.transpose(-1, -2) @ d_out[..., qs, :]
            ds = (d_out[..., qs, :] @ v[..., ks, :].transpose(-1, -2)).sub_(delta[..., qs, None]).mul_(p)
            dq[..., qs, :] += ds @ k[..., ks, :] * scale
            dk[..., ks, :] += ds.transpose(-1, -2) @ q[..., qs, :] * scale


def ring_attention_simulated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor,
                             world_size: int, causal: bool = True) -> tuple[torch.Tensor, ...]:
    """All W ranks' ring steps in one process (the schedule the real ranks follow): out, dq, dk, dv, unsharded."""
    w, seq = positive_int(world_size, "world_size"), q.shape[-2]
    pos = [zigzag_positions(seq, w, r) for r in range(w)]
    shard = [[zigzag_shard(t, w, r) for r in range(w)] for t in (q, k, v, d_out)]
    states = [start_state(shard[0][r]) for r in range(w)]
    for step in range(w):                          # at step t rank r holds the K/V block that started on r - t
        for r in range(w):
            src = (r - step) % w
            forward_block(states[r], shard[0][r], pos[r], shard[1][src], shard[2][src], pos[src], causal)
    dq = [torch.zeros_like(s) for s in shard[0]]
    dkv = [(torch.zeros_like(s), torch.zeros_like(s)) for s in shard[1]]    # indexed by the block's owner
    for step in range(w):
        for r in range(w):
            src = (r - step) % w
            backward_block(shard[0][r], pos[r], shard[1][src], shard[2][src], pos[src], states[r].out,
                           states[r].lse, shard[3][r], dq[r], dkv[src][0], dkv[src][1], causal)
    return (zigzag_unshard([s.out for s in states], seq), zigzag_unshard(dq, seq),
            zigzag_unshard([d[0] for d in dkv], seq), zigzag_unshard([d[1] for d in dkv], seq))


def causal_pairs_per_rank(seq_len: int, world_size: int, split: str = "zigzag") -> list[int]:
    """Unmasked (query, key) pairs each rank computes under causal attention: 'zigzag' or 'contiguous' split."""
    w = positive_int(world_size, "world_size")
    if split == "zigzag":
        ranks = [zigzag_positions(seq_len, w, r) for r in range(w)]
    elif split == "contiguous":
        ranks = list(torch.arange(seq_len).chunk(w))
    else:
        raise ValueError(f"split must be 'zigzag' or 'contiguous', got {split!r}")
    return [int((pos + 1).sum()) for pos in ranks]        # query at position p sees p + 1 keys


def ring_peak_bytes(batch: int, heads: int, seq_len: int, head_dim: int, world_size: int,
                    bytes_per_element: int = 4) -> dict[str, int]:
    """One rank's forward working set, each term named: its inputs (Q shard, own K/V block), what it builds (output,
    row lse), the K/V blocks received (the held one and the one arriving: min(2, W-1)), one chunk pair's scores
    (built in place) with its causal mask, and the copy of them the CPU matrix multiply packs for P V (measured:
    a fresh 1024 x 1024 block times V raises the peak by about one more block)."""
    w = positive_int(world_size, "world_size")
    chunk = _chunk_len(seq_len, w)
    shard = batch * heads * (seq_len // w) * head_dim * bytes_per_element
    return {"inputs: Q shard + own K/V block": 3 * shard, "output shard": shard,
            "row log-sum-exp": batch * heads * (seq_len // w) * bytes_per_element,
            "K/V blocks received (held + arriving)": min(2, w - 1) * 2 * shard,
            "one chunk pair's scores + mask": batch * heads * chunk * chunk * bytes_per_element + chunk * chunk,
            "the GEMM's packed copy of the weights (P V)": batch * heads * chunk * chunk * bytes_per_element}


INPUT_TERMS = ("inputs: Q shard + own K/V block",)     # allocated before the forward starts
PACKING_TERMS = ("the GEMM's packed copy of the weights (P V)",)   # the BLAS packs, or not, or reuses a buffer


def all_gather_peak_bytes(batch: int, heads: int, seq_len: int, head_dim: int, world_size: int,
                          bytes_per_element: int = 4) -> dict[str, int]:
    """The rival a rank's measured peak rules out: all-gather context parallelism without the blockwise fold (as
    in Llama 3's CP), which gathers every K/V block and builds its Q shard's scores and weights against the whole
    sequence at once ((s/W) x s each), beside its output shard. New bytes only, as :func:`ring_peak_bytes`'s."""
    w = positive_int(world_size, "world_size")
    shard = batch * heads * (seq_len // w) * head_dim * bytes_per_element
    return {"output shard": shard, "K/V blocks gathered": (w - 1) * 2 * shard,
            "scores + weights (s/W x s)": 2 * batch * heads * (seq_len // w) * seq_len * bytes_per_element}


def full_attention_peak_bytes(batch: int, heads: int, seq_len: int, head_dim: int,
                              bytes_per_element: int = 4) -> dict[str, int]:
    """The unsplit reference's working set: Q, K, V, O and the materialised (s x s) scores and weights."""
    whole = batch * heads * seq_len * head_dim * bytes_per_element
    return {"Q, K, V, O": 4 * whole, "scores + weights (s x s)": 2 * batch * heads * seq_len ** 2 * bytes_per_element}
