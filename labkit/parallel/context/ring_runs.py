"""Ring attention on real ranks: K/V blocks sent around a gloo (or NCCL) ring with isend/irecv, the next block
arriving while the held one is computed on; exactness against full attention, the overlap timed, memory measured.

Each rank runs :func:`ring_job` inside :func:`labkit.comm.launch.launch` (:func:`run_ring`): the block maths is
:mod:`labkit.parallel.context.ring_attention` (Liu et al. 2023, arXiv:2310.01889). The backward pass sends each K/V block's
gradient accumulator along behind it, and after the last step home to the block's owner. Timing: four variants in
interleaved rounds — overlapped, serial (wait for each block before computing), compute only, communication only —
the slowest rank's seconds per round, and each rank's CPU share (:class:`labkit.core.contention.ShareMeter`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.distributed as dist

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.validation import positive_int
from labkit.memory.host import host_peak_unavailable, measure_host_peak_bytes
from labkit.parallel.context.ring_attention import (RingState, backward_block, forward_block, start_state, zigzag_positions,
                                            zigzag_shard)

KV_TAG, GRAD_TAG = 1, 2
VARIANTS = ("overlapped", "serial", "compute_only", "comm_only")


@dataclass(frozen=True)
class RingConfig:
    """One ring attention run: shapes, ranks' check / timing / memory sizes, rounds."""

    batch: int = 1
    heads: int = 2
    head_dim: int = 32
    check_seq: int = 64            # exactness check (float64)
    time_seq: int = 1024           # overlap timing (float32)
    memory_seq: int = 4096         # forward peak measured per rank (float32)
    rounds: int = 5
    causal: bool = True

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "head_dim", "check_seq", "time_seq", "memory_seq", "rounds"):
            positive_int(getattr(self, name), name)

    @classmethod
    def fast(cls) -> "RingConfig":
        """CPU-sized: a few seconds on 2 cores."""
        return cls()


def _pass(block: torch.Tensor, rank: int, w: int, tag: int) -> tuple[torch.Tensor, list]:
    """Send ``block`` to the next rank and receive the previous rank's into a new buffer (both non-blocking)."""
    recv = torch.empty_like(block)
    return recv, [dist.isend(block, (rank + 1) % w, tag=tag), dist.irecv(recv, (rank - 1) % w, tag=tag)]


def _wait(reqs: list) -> None:
    """Wait for each request once, then forget it (gloo's wait on a finished request can block)."""
    while reqs:
        reqs.pop(0).wait()


def _next_block(held: torch.Tensor, rank: int, w: int, step: int, comm: bool,
                overlap: bool) -> tuple[torch.Tensor | None, list]:
    """Start passing the held K/V block on (serial: wait for it at once); (None, []) where nothing moves. The
    caller swaps blocks on ``recv is not None``: after a serial wait the request list is already empty."""
    if not (comm and step < w - 1):
        return None, []
    recv, reqs = _pass(held, rank, w, KV_TAG)
    if not overlap:
        _wait(reqs)
    return recv, reqs


def ring_forward(q: torch.Tensor, kv: torch.Tensor, seq_len: int, causal: bool = True, overlap: bool = True,
                 compute: bool = True, comm: bool = True) -> RingState:
    """This rank's attention output and lse: W steps, each folding in the held K/V block (kv: (2, b, h, t, d))."""
    rank, w = dist.get_rank(), dist.get_world_size()
    state, held, mine = start_state(q), kv, zigzag_positions(seq_len, w, rank)
    for step in range(w):
        src = (rank - step) % w
        recv, reqs = _next_block(held, rank, w, step, comm, overlap)
        if compute:
            forward_block(state, q, mine, held[0], held[1], zigzag_positions(seq_len, w, src), causal)
        if recv is not None:
            _wait(reqs)
            held = recv
    return state


def ring_backward(q: torch.Tensor, kv: torch.Tensor, state: RingState, d_out: torch.Tensor, seq_len: int,
                  causal: bool = True, overlap: bool = True, compute: bool = True,
                  comm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dkv) of this rank's shard: K/V go round again; each block's gradient follows it and ends at its owner."""
    rank, w = dist.get_rank(), dist.get_world_size()
    dq, held, mine = torch.zeros_like(q), kv, zigzag_positions(seq_len, w, rank)
    grad_in, grad_reqs, dkv = None, [], torch.zeros_like(kv)
    for step in range(w):
        src = (rank - step) % w
        recv, reqs = _next_block(held, rank, w, step, comm, overlap)
        dkv = torch.zeros_like(kv)
        if compute:
            backward_block(q, mine, held[0], held[1], zigzag_positions(seq_len, w, src), state.out, state.lse,
                           d_out, dq, dkv[0], dkv[1], causal)
        if comm:
            _wait(grad_reqs)
            if grad_in is not None:
                dkv += grad_in                               # what the ranks before added to this block
            grad_in, grad_reqs = _pass(dkv, rank, w, GRAD_TAG)
            if not overlap:
                _wait(grad_reqs)
        if recv is not None:
            _wait(reqs)
            held = recv
    _wait(grad_reqs)
    return dq, (grad_in if comm else dkv)


def _inputs(cfg: RingConfig, seq_len: int, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """q, k, v, d_out (batch, heads, seq, head_dim): the same on every rank (one seed)."""
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(cfg.batch, cfg.heads, seq_len, cfg.head_dim, generator=gen, dtype=dtype).to(device)
            for _ in range(4)]


def reference_inputs(cfg: RingConfig, seq_len: int) -> list[torch.Tensor]:
    """The float64 q, k, v, d_out every rank draws at ``seq_len``, on the CPU (for the full-attention reference)."""
    return _inputs(cfg, seq_len, torch.float64, torch.device("cpu"))


def _shards(cfg: RingConfig, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """This rank's q, packed kv and d_out."""
    rank, w = dist.get_rank(), dist.get_world_size()
    q, k, v, d_out = (zigzag_shard(t, w, rank) for t in _inputs(cfg, seq_len, dtype, rank_device()))
    return q, torch.stack([k, v]), d_out


def _exact(cfg: RingConfig, overlap: bool = True) -> dict:
    """This rank's output and gradients at ``check_seq`` in float64, to be compared with full attention (the serial
    variant too: the timed comparison is only fair if both compute the same thing)."""
    q, kv, d_out = _shards(cfg, cfg.check_seq, torch.float64)
    state = ring_forward(q, kv, cfg.check_seq, cfg.causal, overlap=overlap)
    dq, dkv = ring_backward(q, kv, state, d_out, cfg.check_seq, cfg.causal, overlap=overlap)
    return {"out": state.out.cpu(), "dq": dq.cpu(), "dk": dkv[0].cpu(), "dv": dkv[1].cpu()}


def _variant(name: str) -> dict:
    return {"overlapped": {}, "serial": {"overlap": False}, "compute_only": {"comm": False},
            "comm_only": {"compute": False}}[name]


def _timed(cfg: RingConfig) -> dict:
    """Seconds of forward + backward per variant per round (this rank's), interleaved, and the CPU share."""
    q, kv, d_out = _shards(cfg, cfg.time_seq, torch.float32)

    def once(kw: dict) -> None:
        state = ring_forward(q, kv, cfg.time_seq, cfg.causal, **kw)
        ring_backward(q, kv, state, d_out, cfg.time_seq, cfg.causal, **kw)

    for name in VARIANTS:
        once(_variant(name))                                    # warm-up: connections, allocator
    out: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with ShareMeter() as meter:
        for r in range(cfg.rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for name in order:
                dist.barrier()
                start = now_s()
                once(_variant(name))
                out[name].append(now_s() - start)
    return {"seconds": out, "cpu_share": meter.share}


def _peak(cfg: RingConfig) -> int | None:
    """How far this rank's resident memory rose during one ring forward at ``memory_seq`` (None: not measurable)."""
    if host_peak_unavailable() is not None or rank_device().type != "cpu":
        return None
    q, kv, _ = _shards(cfg, cfg.memory_seq, torch.float32)
    dist.barrier()
    return measure_host_peak_bytes(lambda: ring_forward(q, kv, cfg.memory_seq, cfg.causal))


def ring_job(cfg_dict: dict) -> dict:
    """One rank's part: exactness, the timed variants, the forward's memory peak."""
    cfg = RingConfig(**cfg_dict)
    return {"rank": dist.get_rank(), "exact": _exact(cfg), "exact_serial": _exact(cfg, overlap=False),
            **_timed(cfg), "peak_bytes": _peak(cfg),
            "backend": dist.get_backend()}


def run_ring(cfg: RingConfig, world_size: int = 2, timeout_s: float = 120.0,
             launcher: Callable = launch) -> list[dict]:
    """Run :func:`ring_job` on ``world_size`` ranks under a timeout; every rank's report, in rank order. The
    zig-zag split's rule is checked for every sequence length before any rank starts."""
    world_size = positive_int(world_size, "world_size")
    for name in ("check_seq", "time_seq", "memory_seq"):
        if getattr(cfg, name) % (2 * world_size):
            raise ValueError(f"RingConfig.{name}={getattr(cfg, name)} must be a multiple of 2 x world_size = "
                             f"{2 * world_size} for the zig-zag split; pick a world size that divides it, or a length")
    return launcher(ring_job, world_size, args=(asdict(cfg),), timeout_s=timeout_s, show_output=False)
