"""Every operator of a real training step, accounted: FLOPs, bytes moved, arithmetic intensity, measured time.

A ``TorchDispatchMode`` sees each ATen operator the step runs (below autograd, so the backward and the
optimizer's operators too). For each one it times the call alone (the device synchronised before and after,
on the kit's clock), counts FLOPs with the formulas of ``torch.utils.flop_counter`` (the ones
``FlopCounterMode`` uses: matmuls, convolutions, attention) or one FLOP per output element for the rest
(elementwise, normalisation: a stated approximation), and counts bytes moved from tensor sizes: every
distinct input read once, every output written once. Views move nothing and are left out.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import flop_registry

from labkit.core.claims import judge_band
from labkit.core.clock import now_s
from labkit.core.step import TrainStep
from labkit.core.timing import synchronize
from labkit.core.torch_compat import TorchDispatchMode, tensor_leaves
from labkit.core.verdict import (ADVICE, INCONCLUSIVE, SPREAD, Load, Rival, Verdict, judge_at_least, judge_at_most,
                                 rival_check)
from labkit.profile.roofline import Roofs

NORM_WORDS = ("norm",)
SKIPPED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh",
           "_local_scalar_dense", "set_", "resize_"}


@dataclass(frozen=True)
class OpCall:
    """One operator call: its name, the shapes it ran on, FLOPs, bytes moved and measured seconds."""

    name: str
    shapes: str
    flops: float
    bytes_moved: float
    time_s: float
    flops_counted: bool        # True: FlopCounterMode's formula; False: one FLOP per output element


def kind_of(name: str, flops_counted: bool) -> str:
    """'matmul/conv' (FlopCounterMode counts it), 'normalisation', or 'elementwise/other'."""
    if flops_counted:
        return "matmul/conv"
    if any(word in name for word in NORM_WORDS):
        return "normalisation"
    return "elementwise/other"


def bytes_moved(args: Any, kwargs: Any, out: Any) -> int:
    """Bytes read (each distinct input tensor once) plus bytes written (each output tensor once)."""
    seen, read = set(), 0
    for t in tensor_leaves((args, kwargs)):
        key = (t.data_ptr(), t.shape, t.dtype)
        if key not in seen:
            seen.add(key)
            read += t.numel() * t.element_size()
    return read + sum(t.numel() * t.element_size() for t in tensor_leaves(out))


def _flops(func: Any, args: Any, kwargs: Any, out: Any) -> tuple[float, bool]:
    """(FLOPs, counted?) by FlopCounterMode's formula where it has one, else one per output element."""
    packet = func.overloadpacket
    if packet in flop_registry:
        return float(flop_registry[packet](*args, **kwargs, out_val=out)), True
    return float(sum(t.numel() for t in tensor_leaves(out))), False


def _shapes(args: Any) -> str:
    return " ".join("x".join(map(str, t.shape)) or "scalar" for t in tensor_leaves(args)[:3])


class OperatorRecorder(TorchDispatchMode):
    """Times and accounts every ATen operator run inside ``with OperatorRecorder(device) as rec:``."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.calls: list[OpCall] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run ``func`` alone between two synchronised clock reads and record what it did."""
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if func.is_view or name in SKIPPED:
            return func(*args, **kwargs)
        synchronize(self.device)
        start = now_s()
        out = func(*args, **kwargs)
        synchronize(self.device)
        elapsed = now_s() - start
        flops, counted = _flops(func, args, kwargs, out)
        self.calls.append(OpCall(name, _shapes(args), flops, float(bytes_moved(args, kwargs, out)), elapsed, counted))
        return out


@dataclass(frozen=True)
class OpStats:
    """One operator at one set of shapes, per training step: calls, FLOPs, bytes, measured and predicted time."""

    name: str
    shapes: str
    kind: str
    calls_per_step: float
    flops: float                    # per step, all calls
    bytes_moved: float              # per step, all calls
    time_s: float                   # per step: calls x the fastest call (interference only ever adds time)
    predicted_s: float              # per step: the roofline's max(FLOPs / peak, bytes / bandwidth)
    bound: str                      # 'compute' or 'memory' (which side of the ridge point)

    @property
    def intensity_flops_per_byte(self) -> float:
        return self.flops / self.bytes_moved if self.bytes_moved else float("inf")

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / self.time_s if self.time_s > 0 else 0.0

    @property
    def measured_over_predicted(self) -> float:
        """Measured time over the roofline's: 1 = on the roof, 3 = a third of the attainable rate."""
        return self.time_s / self.predicted_s if self.predicted_s > 0 else float("inf")

    def point(self) -> dict:
        """The operator as a point for :func:`labkit.profile.roofline.plot_roofline`."""
        return {"label": self.name, "kind": self.kind, "intensity_flops_per_byte": self.intensity_flops_per_byte,
                "achieved_flops_per_s": self.achieved_flops_per_s}


def aggregate(calls: Sequence[OpCall], steps: int, roofs: Roofs, dtype: str = "fp32") -> list[OpStats]:
    """Group calls by (operator, shapes) into per-step rows, slowest first; time = calls x the fastest call,
    as a roof is its best repeat: on a shared machine the slower calls measure the neighbours."""
    groups: dict[tuple[str, str], list[OpCall]] = defaultdict(list)
    for call in calls:
        groups[(call.name, call.shapes)].append(call)
    rows = []
    for (name, shapes), group in groups.items():
        per_step = len(group) / steps
        flops = per_step * group[0].flops
        nbytes = per_step * group[0].bytes_moved
        rows.append(OpStats(name, shapes, kind_of(name, group[0].flops_counted), per_step, flops, nbytes,
                            per_step * min(c.time_s for c in group),
                            roofs.predict_time_s(flops, nbytes, dtype), roofs.bound(flops, nbytes, dtype)))
    return sorted(rows, key=lambda r: r.time_s, reverse=True)


def record_training_steps(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], *, steps: int = 2,
                          device: torch.device | None = None, lr: float = 0.01,
                          loss_fn: Callable | None = None) -> list[OpCall]:
    """The kit's one training step (:class:`labkit.core.step.TrainStep`, SGD with momentum): one untimed warm-up
    step, then ``steps`` recorded ones; returns every operator call of the recorded steps."""
    device = device or next(model.parameters()).device
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    step = TrainStep(model, optimizer, loss_fn=loss_fn or nn.functional.cross_entropy, device=device)
    step(*batch)
    with OperatorRecorder(device) as recorder:
        for _ in range(steps):
            step(*batch)
    return recorder.calls


def share_of_time(rows: Sequence[OpStats], kind: str) -> float:
    """Fraction of the accounted time spent in operators of ``kind``."""
    total = sum(r.time_s for r in rows)
    return sum(r.time_s for r in rows if r.kind == kind) / total if total else 0.0


def heaviest(rows: Sequence[OpStats], kinds: Sequence[str], by: str = "flops", share: float = 0.8) -> list[OpStats]:
    """The rows of ``kinds`` that, largest first, together carry ``share`` of those kinds' FLOPs (or bytes)."""
    mine = sorted((r for r in rows if r.kind in kinds), key=lambda r: getattr(r, by), reverse=True)
    total, picked, running = sum(getattr(r, by) for r in mine), [], 0.0
    for r in mine:
        if running >= share * total:
            break
        picked.append(r)
        running += getattr(r, by)
    return picked


def roof_ratio(rows: Sequence[OpStats]) -> float:
    """Measured over predicted time for a group of operators (time-weighted: sum over sum); 1 = on the roof."""
    predicted = sum(r.predicted_s for r in rows)
    return sum(r.time_s for r in rows) / predicted if predicted > 0 else float("inf")


ROOFS_PRICED = ("bandwidth", "compute")


def rival_roof_ratio(rows: Sequence[OpStats], roofs: Roofs, priced_at: str, dtype: str = "fp32") -> float:
    """What :func:`roof_ratio` would read if every operator of ``rows`` ran at one roof only, ``priced_at``
    'bandwidth' (bytes / the bandwidth of the level they fit in) or 'compute' (FLOPs / peak): that time over the
    roofline's. At most 1, since the roofline takes the larger of the two; a rival, not a bound."""
    if priced_at not in ROOFS_PRICED:
        raise ValueError(f"priced_at is one of {ROOFS_PRICED}, got {priced_at!r}")
    predicted = sum(r.predicted_s for r in rows)
    if priced_at == "bandwidth":
        rival_s = sum(r.bytes_moved / roofs.bandwidth_for(r.bytes_moved) for r in rows)
    else:
        rival_s = sum(r.flops for r in rows) / roofs.peak_flops_per_s(dtype)
    return rival_s / predicted if predicted > 0 else 0.0


def judge_near_roof(claim: str, rows: Sequence[OpStats], roofs: Roofs, band: tuple[float, float], load: Load,
                    priced_at: str, dtype: str = "fp32") -> Verdict:
    """Is the group's measured/roofline ratio inside ``band``, and does it reject the rival 'every operator priced at
    the ``priced_at`` roof' (issue 51)? The band's low edge rises, where needed, to the rival's ratio times (1 + the
    roofs' measured spread, best repeat over median): closer than that the run cannot tell the roofline from its
    rival. Outside the band, INCONCLUSIVE only where this run's load explains the gap."""
    measured = roof_ratio(rows)
    rival = Rival(f"every operator priced at the {priced_at} roof", max(rival_roof_ratio(rows, roofs, priced_at,
                                                                                          dtype), 1e-12))
    spread = roofs.measurement_spread(dtype)
    low, high = max(band[0], rival.value * (1.0 + spread)), band[1]
    unit = "x the roofline's time"
    if rival.value >= band[0]:              # inside or above the lesson's band: no run could tell them apart
        return rival_check(claim, rival, True, f"{band[0]:g}-{band[1]:g}{unit}", unit)
    if low > high:                          # the roofs' spread pushed the low edge past the top: this run's fault
        return Verdict(claim, INCONCLUSIVE, f"the roofs were measured through load: their best repeat is "
                       f"{1 + spread:.3g}x their median, so the low edge that rejects {rival.name} "
                       f"({rival.value:.3g} x {1 + spread:.3g}) passes the band's top ({high:g}){unit}; {ADVICE}",
                       kind=SPREAD, rival=rival.name)
    if low <= measured <= high:
        return judge_band(claim, measured, low, high, rival=rival, unit=unit,
                          source=f"the lesson's band, its low edge at least the rival's ratio + the roofs' measured "
                                 f"spread ({spread:.0%})")
    if measured < low:
        return judge_at_least(claim, max(measured, 1e-12), low, load=load, rival=rival, unit=unit)
    return judge_at_most(claim, measured, high, load=load, unit=unit)    # above the band: never checked


def step_roof_times(calls: Sequence[OpCall], steps: int, roofs: Roofs,
                    dtype: str = "fp32") -> tuple[float, float, float]:
    """(FLOPs / peak, bytes / bandwidth, the roofline's time) of one training step, summed over its operators:
    each operator's bytes priced at the roof of the level they fit in, its time the larger of its two."""
    compute_s = sum(c.flops for c in calls) / roofs.peak_flops_per_s(dtype)
    memory_s = sum(c.bytes_moved / roofs.bandwidth_for(c.bytes_moved) for c in calls)
    roofline_s = sum(roofs.predict_time_s(c.flops, c.bytes_moved, dtype) for c in calls)
    return compute_s / steps, memory_s / steps, roofline_s / steps


def as_table(rows: Sequence[OpStats], top: int = 12) -> list[dict]:
    """The ``top`` slowest operators as table rows with units: MFLOP, MB, FLOP/B, ms."""
    return [{"operator": r.name, "shapes": r.shapes, "kind": r.kind, "calls/step": r.calls_per_step,
             "MFLOP": r.flops / 1e6, "MB": r.bytes_moved / 1e6, "FLOP/B": r.intensity_flops_per_byte,
             "measured ms": r.time_s * 1e3, "roofline ms": r.predicted_s * 1e3,
             "measured/roofline": r.measured_over_predicted, "bound": r.bound} for r in rows[:top]]
