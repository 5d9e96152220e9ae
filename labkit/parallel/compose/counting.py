"""Bytes each axis of the mesh sent, counted per axis: the collectives and point-to-point sends a step issues,
attributed to the axis whose process group they ran on.

Collectives are billed with the ring convention of :func:`labkit.sharding.comm_volume.ring_bytes_sent` (an
all-reduce of N bytes sends 2(R-1)/R N per rank; Patarasuk & Yuan 2009); a send bills its tensor's bytes. Like
``comm_volume.counting_collectives`` this patches ``torch.distributed``'s functions for the length of a ``with``
block: the kit's TP operators, FSDP2 and the hand-written pipeline and ring all look them up when called.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Iterator

import torch.distributed as dist

from labkit.comm.mesh import AxisGroup
from labkit.sharding.comm_volume import ring_bytes_sent

# name on torch.distributed -> (kind, position of the tensor that holds the full size, its keyword)
COLLECTIVES = {"all_reduce": ("all_reduce", 0, "tensor"),
               "all_gather_single": ("all_gather", 0, "output_tensor"),
               "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
               "reduce_scatter_single": ("reduce_scatter", 1, "input"),
               "reduce_scatter_tensor": ("reduce_scatter", 1, "input")}
SENDS = ("send", "isend")


class AxisBytes:
    """Bytes sent per axis: ``record`` is called by the patched functions; ``per_axis()`` reads the totals."""

    def __init__(self, groups: dict[str, AxisGroup], extra: dict[str, Any] | None = None) -> None:
        self._axis_of: list[tuple[Any, str, int]] = [(g.group, key, g.size) for key, g in groups.items()]
        for key, (group, size) in (extra or {}).items():     # e.g. a DeviceMesh's sub-group for FSDP2
            self._axis_of.insert(0, (group, key, size))
        self.bytes: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def axis(self, group: Any) -> tuple[str, int]:
        """(axis key, group size) of a process group; a call on the whole world (group None) is an error here."""
        for known, key, size in self._axis_of:
            if known is group:
                return key, size
        raise ValueError("a collective ran on a group that is not one of the mesh's axes (the default group?): "
                         "every call in a composition names its axis's group")

    def record_collective(self, kind: str, full_bytes: int, group: Any) -> None:
        """Bill one collective to its axis with the ring convention."""
        key, size = self.axis(group)
        self.bytes[key] += ring_bytes_sent(kind, full_bytes, size)
        self.calls[key] += 1

    def record_send(self, nbytes: int, group: Any) -> None:
        """Bill one point-to-point send (the sender's bytes) to its axis."""
        key, _ = self.axis(group)
        self.bytes[key] += nbytes
        self.calls[key] += 1

    def per_axis(self) -> dict[str, float]:
        """Bytes this rank sent, by axis key."""
        return dict(self.bytes)


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def counting_axes(counter: AxisBytes) -> Iterator[AxisBytes]:
    """Patch ``torch.distributed``'s collectives and sends to bill ``counter`` per axis while the block runs."""
    originals: dict[str, Any] = {}

    def collective(name: str, kind: str, pos: int, kw: str) -> Any:
        original = originals[name]

        def counted(*args: Any, **kwargs: Any) -> Any:
            full = args[pos] if len(args) > pos else kwargs[kw]
            counter.record_collective(kind, _nbytes(full), kwargs.get("group"))
            return original(*args, **kwargs)
        return counted

    def send(name: str) -> Any:
        original = originals[name]

        def counted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            counter.record_send(_nbytes(tensor), kwargs.get("group"))
            return original(tensor, *args, **kwargs)
        return counted

    for name in (*COLLECTIVES, *SENDS):
        if getattr(dist, name, None) is not None:
            originals[name] = getattr(dist, name)
    patched = {name: collective(name, *COLLECTIVES[name]) if name in COLLECTIVES else send(name) for name in originals}
    for name, fn in patched.items():
        setattr(dist, name, fn)
    try:
        yield counter
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
