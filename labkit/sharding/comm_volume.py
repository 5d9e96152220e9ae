"""Bytes each rank sends per training step under DDP / ZeRO-1 / ZeRO-2 / ZeRO-3, three ways.

1. ``predicted_bytes_per_step``: the closed form. With a ring, an all-reduce of N bytes sends 2(R-1)/R * N per
   rank and is a reduce-scatter ((R-1)/R * N) followed by an all-gather ((R-1)/R * N) (Patarasuk & Yuan 2009).
   DDP all-reduces the gradients; ZeRO-1/2 reduce-scatter them and all-gather the updated parameters (the
   same total); ZeRO-3 all-gathers the parameters in forward *and* again in backward: 1.5x DDP
   (Rajbhandari et al. 2020, arXiv:1910.02054, Section 7).
2. ``simulated_bytes_per_step``: the kit's message-level ring simulator (``labkit.comm.collectives``) run on a buffer
   of the model's size, its reduce-scatter and all-gather phases billed separately.
3. ``CommCounter``: the collectives a real run issues (FSDP2, the hand-written ZeRO-1, DDP's comm hook),
   recorded with their full sizes and converted with the same ring convention.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from labkit.comm.collectives import allreduce
from labkit.core.validation import checked_int, positive_int
from labkit.sharding.memory import check_strategy

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
# collectives per step, each over the full parameter (= gradient) bytes; FSDP2's ZeRO-2 gathers once
STEP_PLAN = {"ddp": ("all_reduce",), "zero1": ("reduce_scatter", "all_gather"),
             "zero2": ("reduce_scatter", "all_gather"), "zero3": ("all_gather", "reduce_scatter", "all_gather")}
MAX_SIMULATED_BYTES = 1 << 28


def ring_bytes_sent(kind: str, full_bytes: int, world_size: int) -> float:
    """Bytes one rank sends in a ring collective over ``full_bytes`` (the whole, unsharded buffer)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    r = positive_int(world_size, "world_size")
    full_bytes = checked_int(full_bytes, "full_bytes", minimum=0)
    share = (r - 1) / r * full_bytes
    return 2 * share if kind == "all_reduce" else share


def predicted_bytes_per_step(strategy: str, param_bytes: int, world_size: int) -> float:
    """Closed-form bytes one rank sends per step (gradients the size of the parameters)."""
    return sum(ring_bytes_sent(kind, param_bytes, world_size) for kind in STEP_PLAN[check_strategy(strategy)])


def _ring_phase_bytes(param_bytes: int, world_size: int) -> dict[str, float]:
    """Max bytes any rank sends in the simulator's reduce-scatter and all-gather phases."""
    if param_bytes * world_size > MAX_SIMULATED_BYTES:
        raise ValueError(f"simulating {param_bytes} B on {world_size} ranks holds {param_bytes * world_size} B in "
                         f"this process (limit {MAX_SIMULATED_BYTES}); simulate a smaller model, bytes scale linearly")
    arrays = [np.zeros(param_bytes // 4, dtype=np.float32) for _ in range(world_size)]
    result = allreduce(arrays, algorithm="ring")
    phases = {"reduce-scatter": np.zeros(world_size), "all-gather": np.zeros(world_size)}
    for step in result.steps:
        phases[step.phase][step.sender] += step.nbytes
    return {"reduce_scatter": float(phases["reduce-scatter"].max()),
            "all_gather": float(phases["all-gather"].max()),
            "all_reduce": float(result.bytes_sent.max())}


def simulated_bytes_per_step(strategy: str, param_bytes: int, world_size: int) -> float:
    """Bytes one rank sends per step, from the kit's ring simulator's message log."""
    r = positive_int(world_size, "world_size")
    if r == 1:
        return 0.0
    if param_bytes % 4:
        raise ValueError(f"param_bytes must be a whole number of float32 elements, got {param_bytes}")
    phase = _ring_phase_bytes(param_bytes, r)
    return sum(phase[kind] for kind in STEP_PLAN[check_strategy(strategy)])


@dataclass
class CommCounter:
    """Records each collective's kind and full size; ``bytes_sent`` converts with the ring convention."""

    world_size: int
    calls: list[tuple[str, int]] = field(default_factory=list)

    def record(self, kind: str, full_bytes: int) -> None:
        """Log one collective: its kind and the full tensor's bytes."""
        self.calls.append((kind, int(full_bytes)))

    def bytes_sent(self) -> float:
        """Bytes one rank sent over every recorded call, by the ring convention."""
        return sum(ring_bytes_sent(kind, nbytes, self.world_size) for kind, nbytes in self.calls)

    def by_kind(self) -> dict[str, int]:
        """Number of calls of each kind."""
        return {kind: sum(1 for k, _ in self.calls if k == kind) for kind in KINDS}

    def reset(self) -> None:
        """Forget the recorded calls."""
        self.calls.clear()

    @staticmethod
    def ddp_hook(process_group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP comm hook: the default all-reduce, but issued through Python's ``dist.all_reduce`` so it is counted.

        DDP's built-in reducer calls the process group from C++, out of reach of ``counting_collectives``.
        """
        return allreduce_hook(process_group, bucket)


# DDP's register_comm_hook compares the hook's annotations with the real classes, and inspect.signature does not
# evaluate the strings `from __future__ import annotations` makes of them: give it the objects.
CommCounter.ddp_hook.__annotations__.update(process_group=dist.ProcessGroup, bucket=dist.GradBucket,
                                            **{"return": torch.futures.Future[torch.Tensor]})


def bytes_written_by_process() -> int | None:
    """Bytes this process has handed to write/send system calls so far (Linux ``/proc/self/io`` ``wchar``).

    Around a step on gloo this is what the sockets carried: the measured counterpart of the nominal count, and
    it shows what the library really does (gloo's reduce-scatter sends as much as a full all-reduce). None where
    /proc is missing; meaningless on NCCL, whose bytes never pass through the process's system calls.
    """
    try:
        with open("/proc/self/io") as f:
            return int(next(line.split()[1] for line in f if line.startswith("wchar:")))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def all_gather_single(output: torch.Tensor, input: torch.Tensor, **kwargs: Any) -> Any:
    """``dist.all_gather_single`` (torch 2.12 on), else its older name ``all_gather_into_tensor``: the same call.

    Looked up when called, so :func:`counting_collectives` counts it; GPU images often ship an older torch."""
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, input, **kwargs)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, **kwargs: Any) -> Any:
    """``dist.reduce_scatter_single`` (torch 2.12 on), else its older name ``reduce_scatter_tensor``."""
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(output, input, **kwargs)


@contextlib.contextmanager
def counting_collectives(counter: CommCounter) -> Iterator[CommCounter]:
    """Patch ``torch.distributed``'s collectives (the ones FSDP2 and the kit call) to record into ``counter``."""
    def wrap(name: str, kind: str, full_arg: int, full_kwarg: str):
        original = getattr(dist, name, None)
        if original is None:                    # torch before 2.12 has no *_single names: nothing to count there
            return None

        def counted(*args, **kwargs):
            full = args[full_arg] if len(args) > full_arg else kwargs[full_kwarg]   # FSDP2 passes keywords
            counter.record(kind, _nbytes(full))
            return original(*args, **kwargs)
        return name, original, counted

    patches = [wrap("all_reduce", "all_reduce", 0, "tensor"),
               wrap("all_gather_single", "all_gather", 0, "output_tensor"),
               wrap("all_gather_into_tensor", "all_gather", 0, "output_tensor"),
               wrap("reduce_scatter_single", "reduce_scatter", 1, "input"),
               wrap("reduce_scatter_tensor", "reduce_scatter", 1, "input")]
    patches = [p for p in patches if p is not None]
    for name, _, counted in patches:
        setattr(dist, name, counted)
    try:
        yield counter
    finally:
        for name, original, _ in patches:
            setattr(dist, name, original)
