"""Watch ``torch.distributed.pipelining`` run: a timestamp for every action, the activations held, the messages sent.

:class:`StageTracer` wraps the methods every schedule calls on a ``PipelineStage`` (``forward_one_chunk``,
``backward_one_chunk``, ``backward_weight_one_chunk`` and the ops builders ``get_*_send_ops`` /
``get_*_recv_ops``), so GPipe, 1F1B, interleaved, looped-BFS, zero-bubble, ZBV and DualPipeV are all timed by
the same few lines, without touching torch's schedules. :class:`ActivationMeter` counts the bytes autograd saves
for backward (``torch.autograd.graph.saved_tensors_hooks``) until the graph that holds them is freed: the
activation memory a schedule keeps alive, the same on CPU and GPU: what ``labkit.memory.model.
saved_activation_bytes`` counts for one forward, followed over a whole step. Runs on each rank (the workers import it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from labkit.core.clock import now_s, thread_time_s
from labkit.core.timing import synchronize
from labkit.memory.saved import storage_key, storage_keys
from labkit.parallel.pipeline.schedule_sim import Span


class _Saved:
    """One tensor autograd saved; releases its bytes from the meter when autograd drops it."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor: torch.Tensor, key: tuple[int, int], meter: "ActivationMeter") -> None:
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self) -> None:
        self.meter._release(self.key)


class ActivationMeter:
    """Live and peak bytes of the activations autograd saves for backward (parameters excluded)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self._param_storages = storage_keys(params)
        self._live: dict[tuple[int, int], list[int]] = {}     # (data pointer, bytes) -> [references, bytes]
        self.live_bytes = self.peak_bytes = 0

    def _pack(self, tensor: torch.Tensor) -> Any:
        if storage_key(tensor) in self._param_storages:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()       # the view's bytes: a micro-batch of a batch counts
        key = (tensor.data_ptr(), nbytes)                      # as itself, and two views of it count once
        entry = self._live.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.live_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[0] += 1
        return _Saved(tensor.detach(), key, self)   # same storage, no grad_fn: no cycle through C++ (memory.model)

    def _release(self, key: tuple[int, int]) -> None:
        entry = self._live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._live[key]

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The context manager to run forwards under."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda s: s.tensor if isinstance(s, _Saved) else s)


@dataclass(frozen=True)
class Post:
    """A send or receive this rank posted (torch completes it asynchronously): when, for which stage and bytes."""

    rank: int
    stage: int
    what: str             # 'send F' (activation), 'send B' (gradient), 'recv F', 'recv B'
    micro_batch: int
    time_s: float
    nbytes: int


def _message_bytes(ops: list) -> int:
    return sum(op.tensor.numel() * op.tensor.element_size() for op in ops)


class StageTracer:
    """Times every action of the stages on this rank; counts point-to-point messages and bytes; remembers what
    the rank did last and which receive it posted last, so a hang can be named."""

    def __init__(self, rank: int, device: torch.device, meter: ActivationMeter) -> None:
        self.rank, self.device, self.meter = rank, device, meter
        self.spans: list[Span] = []
        self.posts: list[Post] = []
        self.messages = self.message_bytes = 0
        self.last_done, self.last_recv = "nothing yet", "none"

    def attach(self, stage: Any) -> None:
        """Wrap this PipelineStage's compute and ops-builder methods (an instance patch; torch's code unchanged)."""
        s = stage.stage_index
        fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

        def forward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            with self.meter.hooks():
                return self._timed(s, "F", chunk, lambda: fwd(chunk, *args, **kwargs))

        def backward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            return self._timed(s, "B" if full else "I", chunk, lambda: bwd(chunk, *args, **kwargs))

        def backward_weight_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            return self._timed(s, "W", chunk, lambda: wgt(chunk, *args, **kwargs))

        stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        for name, what in (("get_fwd_send_ops", "send F"), ("get_bwd_send_ops", "send B"),
                           ("get_fwd_recv_ops", "recv F"), ("get_bwd_recv_ops", "recv B")):
            setattr(stage, name, self._ops(getattr(stage, name), s, what))

    def _ops(self, build: Callable[[int], list], stage: int, what: str) -> Callable[[int], list]:
        def ops(chunk: int) -> list:
            out = build(chunk)
            if out:
                self.posts.append(Post(self.rank, stage, what, chunk, now_s(), _message_bytes(out)))
            if out and what.startswith("send"):
                self.messages += len(out)
                self.message_bytes += _message_bytes(out)
            elif out:
                payload = "activation" if what == "recv F" else "gradient"
                self.last_recv = f"the {payload} for stage {stage}, micro-batch {chunk}"
            return out
        return ops

    def _timed(self, stage: int, kind: str, chunk: int, run: Callable[[], Any]) -> Any:
        synchronize(self.device)
        c0, t0 = thread_time_s(), now_s()
        out = run()
        synchronize(self.device)
        self.spans.append(Span(self.rank, stage, kind, chunk, t0, now_s(), thread_time_s() - c0))
        self.last_done = f"{kind}{chunk} of stage {stage}"
        return out

    def reset(self) -> None:
        """Forget the last step's spans and counts (the peak restarts from what is held now)."""
        self.spans, self.posts, self.messages, self.message_bytes = [], [], 0, 0
        self.last_done, self.last_recv = "nothing yet in this step", "none"
        self.meter.peak_bytes = self.meter.live_bytes

    def where(self) -> str:
        """Where this rank is: its last finished action and the last receive it posted."""
        return f"after {self.last_done}, waiting on {self.last_recv}"

    def cpu_share(self) -> float:
        """CPU time over wall time of this rank's actions (1.0: it had a core to itself while it worked)."""
        wall = sum(s.duration_s for s in self.spans)
        return min(1.0, sum(s.cpu_s for s in self.spans) / wall) if wall > 0 else 1.0
