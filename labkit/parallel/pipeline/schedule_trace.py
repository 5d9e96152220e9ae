"""Watch ``torch.distributed.pipelining`` run: a timestamp for every action, the activations held, the messages sent.

:class:`StageTracer` wraps the methods every schedule calls on a ``PipelineStage`` (``forward_one_chunk``,
``backward_one_chunk``, ``backward_weight_one_chunk`` and the ops builders ``get_*_send_ops`` /
``get_*_recv_ops``), so GPipe, 1F1B, interleaved, looped-BFS, zero-bubble, ZBV and DualPipeV are all timed by
the same few lines, without touching torch's schedules. :class:`ActivationMeter` counts the bytes autograd saves
for backward (through the kit's one saved-tensor hook, ``labkit.memory.saved``) until the graph that holds them is
freed: the activation memory a schedule keeps alive, the same on CPU and GPU: what ``labkit.memory.model.
saved_activation_bytes`` counts for one forward, followed over a whole step. Runs on each rank (the workers import it).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from labkit.core.clock import now_s, thread_time_s
from labkit.core.timing import synchronize
from labkit.core.torch_compat import tensor_leaves
from labkit.memory.saved import storage_bytes, storage_key, storage_keys, watch_saved
from labkit.parallel.pipeline.schedule_sim import Span


class ActivationMeter:
    """Live and peak bytes of the activations autograd saves for backward, followed over a whole step through the
    kit's one saved-tensor hook (:func:`labkit.memory.saved.watch_saved`): each storage counted once, whole (views
    of one allocation are one allocation), parameters and the tensors handed to a forward left out (they existed
    before it: on the first stage, the micro-batches are views of the input batch)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self._excluded = storage_keys(params)
        self._live: dict[int, list[int]] = {}      # storage key -> [saved tensors holding it, its bytes]
        self.live_bytes = self.peak_bytes = 0

    def _on_save(self, tensor: torch.Tensor) -> None:
        key = storage_key(tensor)
        if not key or key in self._excluded:
            return
        entry = self._live.setdefault(key, [0, storage_bytes(tensor)])
        if entry[0] == 0:
            self.live_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[0] += 1

    def _on_free(self, tensor: torch.Tensor) -> None:
        entry = self._live.get(storage_key(tensor))
        if entry is None:                          # excluded when saved (a parameter, an input), or empty
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._live[storage_key(tensor)]

    @contextlib.contextmanager
    def hooks(self, inputs: Iterable[torch.Tensor] = ()) -> Iterator[None]:
        """The context manager to run a forward under; ``inputs`` (what the forward was handed) are not counted."""
        added = storage_keys(inputs) - self._excluded
        self._excluded |= added
        try:
            with watch_saved(self._on_save, self._on_free):
                yield
        finally:
            self._excluded -= added


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
            with self.meter.hooks(inputs=tensor_leaves((args, kwargs))):
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
