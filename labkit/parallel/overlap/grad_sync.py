"""Gradient all-reduce by hand, three ways behind one interface: after backward (naive), per parameter from a
gradient hook, and per bucket from a gradient hook, each waiting only before the optimizer step.

Each parameter's ``register_post_accumulate_grad_hook`` fires as soon as autograd has written its gradient. The
overlapping syncs launch ``dist.all_reduce(..., async_op=True)`` there, so the all-reduce runs on gloo's (or
NCCL's) own thread while backward goes on computing the earlier layers; ``finish()`` waits for every handle and
copies the averaged buckets back. Buckets fill in reverse parameter order (the order backward produces them) and
close once they hold ``bucket_cap_bytes``, as DDP's reducer does (Li et al. 2020, "PyTorch Distributed",
arXiv:2006.15704, section 3.2.3). Every launch and finish is stamped on :mod:`labkit.core.clock`; the finish from
the work's future callback, which runs when the collective completes, not when someone waits for it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from labkit.core.clock import now_s

MODES = ("naive", "per_param", "bucketed")


def assign_buckets(param_bytes: Sequence[int], bucket_cap_bytes: float) -> list[list[int]]:
    """Parameter indices grouped into buckets, last parameter first (backward's order): a bucket closes once it
    holds at least ``bucket_cap_bytes`` (0: one parameter per bucket; ``math.inf``: one bucket for all)."""
    if not (bucket_cap_bytes >= 0):
        raise ValueError(f"bucket_cap_bytes must be >= 0 (math.inf for one bucket), got {bucket_cap_bytes!r}")
    if any(int(b) <= 0 for b in param_bytes):
        raise ValueError(f"every parameter needs a positive size in bytes, got {list(param_bytes)}")
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0
    for index in reversed(range(len(param_bytes))):
        current.append(index)
        held += int(param_bytes[index])
        if held >= bucket_cap_bytes:
            buckets.append(current)
            current, held = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class BucketEvent:
    """One bucket's all-reduce on this rank: its bytes and when it was launched and finished (clock seconds)."""

    bucket: int
    nbytes: int
    launch_s: float
    finish_s: float = math.nan


@dataclass
class _InFlight:
    bucket: int
    flat: torch.Tensor
    work: dist.Work
    event: BucketEvent


class GradSync:
    """Average the gradients of ``model`` over the default process group: ``"naive"`` all-reduces each gradient
    after backward; ``"per_param"`` and ``"bucketed"`` launch asynchronous all-reduces from gradient hooks during
    backward. Call :meth:`finish` between backward and the optimizer step (a ``TrainStep`` ``grad_hook``)."""

    def __init__(self, model: nn.Module, mode: str = "bucketed", bucket_cap_bytes: float = 1 << 20) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.params = [p for p in model.parameters() if p.requires_grad]
        cap = 0 if mode == "per_param" else (math.inf if mode == "naive" else bucket_cap_bytes)
        self.buckets = assign_buckets([p.numel() * p.element_size() for p in self.params], cap)
        self._bucket_of = {id(self.params[i]): b for b, bucket in enumerate(self.buckets) for i in bucket}
        self._pending = [len(b) for b in self.buckets]
        self._in_flight: list[_InFlight] = []
        self.events: list[BucketEvent] = []
        self.wait_s = 0.0
        self._handles = [] if mode == "naive" else [p.register_post_accumulate_grad_hook(self._on_grad)
                                                    for p in self.params]

    def _on_grad(self, param: torch.Tensor) -> None:
        """A gradient is ready: when it completes its bucket, launch that bucket's all-reduce."""
        bucket = self._bucket_of[id(param)]
        self._pending[bucket] -= 1
        if self._pending[bucket] == 0:
            self._launch(bucket)

    def _launch(self, bucket: int) -> None:
        members = [self.params[i] for i in self.buckets[bucket]]
        # one parameter: reduce its gradient in place; several: one flat copy, (sum of numels,)
        flat = members[0].grad if len(members) == 1 else torch.cat([p.grad.reshape(-1) for p in members])
        flat.div_(dist.get_world_size())
        event = BucketEvent(bucket, flat.numel() * flat.element_size(), now_s())
        work = dist.all_reduce(flat, async_op=True)
        work.get_future().add_done_callback(lambda _fut, e=event: setattr(e, "finish_s", now_s()))
        self._in_flight.append(_InFlight(bucket, flat, work, event))

    def finish(self, model: nn.Module | None = None) -> None:
        """Wait for every launched all-reduce (naive: run them now) and leave the averaged gradients in place."""
        start = now_s()
        if self.mode == "naive":
            self._launch(0)
        for item in self._in_flight:
            item.work.wait()
            if not math.isfinite(item.event.finish_s):      # the callback runs after wait() may return
                item.event.finish_s = now_s()
            members = [self.params[i] for i in self.buckets[item.bucket]]
            if len(members) > 1:
                offset = 0
                for p in members:                           # copy the flat bucket back, parameter by parameter
                    p.grad.copy_(item.flat[offset:offset + p.numel()].view_as(p.grad))
                    offset += p.numel()
            self.events.append(item.event)
        self.wait_s = now_s() - start
        missing = [b for b, n in enumerate(self._pending) if n > 0 and self.mode != "naive"]
        self._in_flight, self._pending = [], [len(b) for b in self.buckets]
        if missing:
            raise RuntimeError(f"buckets {missing} never received all their gradients: a parameter took no part in "
                               "this loss (DDP's find_unused_parameters case), so their all-reduce never launched")

    def take_events(self) -> list[BucketEvent]:
        """This step's bucket events, cleared for the next step."""
        events, self.events = self.events, []
        return events

    def remove(self) -> None:
        """Unregister the gradient hooks (the model is left as it was)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


@dataclass
class LayerTimeline:
    """When each named layer's backward ran on this rank (clock seconds), from module backward hooks."""

    starts_s: dict[str, float] = field(default_factory=dict)
    ends_s: dict[str, float] = field(default_factory=dict)

    def clear(self) -> None:
        """Forget the last step."""
        self.starts_s.clear()
        self.ends_s.clear()

    def spans(self) -> list[tuple[str, float, float]]:
        """(layer, start, end) in the order backward ran them."""
        return sorted(((n, self.starts_s[n], self.ends_s[n]) for n in self.ends_s if n in self.starts_s),
                      key=lambda span: span[1])


def record_layer_backward(model: nn.Module, kinds: tuple[type, ...] = (nn.Linear,)) -> tuple[LayerTimeline, list]:
    """Stamp every ``kinds`` submodule's backward: its start (a backward pre-hook: the output's gradient arrived) and
    its end (the last of its parameters' post-accumulate-grad hooks: its gradients are ready for an all-reduce; a full
    backward hook would fire early on a first layer whose input needs no gradient). Returns the timeline and the
    hook handles."""
    timeline, handles = LayerTimeline(), []
    for name, module in model.named_modules():
        if isinstance(module, kinds):
            handles.append(module.register_full_backward_pre_hook(
                lambda _m, _g, n=name: timeline.starts_s.__setitem__(n, now_s())))
            for p in module.parameters(recurse=False):
                if p.requires_grad:
                    handles.append(p.register_post_accumulate_grad_hook(
                        lambda _p, n=name: timeline.ends_s.__setitem__(n, now_s())))
    return timeline, handles
