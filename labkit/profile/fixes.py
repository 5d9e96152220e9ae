"""The fixes, each matched to its wall: fusion for memory-bound chains, bigger batches and CUDA graphs for
overhead, TF32/bf16 for the compute roof. Each is measured where its wall is the limit and where it is not.

Fusion: ``torch.compile`` (Ansel et al. 2024, "PyTorch 2", ASPLOS) turns a chain of elementwise operators, each
reading and writing the whole tensor, into one kernel that reads the input once and writes the output once.
The roofline predicts the gain of a memory-bound chain as bytes(eager) / bytes(fused); on a compute-bound
matmul, fusion has nothing to save. CUDA graphs replay a captured sequence of kernels with one launch.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from labkit.core.clock import interleaved, paired_median
from labkit.core.step import TrainStep
from labkit.core.timing import time_fn
from labkit.profile.operators import OperatorRecorder
from labkit.profile.roofline import Roofs


def tanh_gelu_chain(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation written out as nine elementwise operators (Hendrycks & Gimpel 2016, eq. 2):
    memory-bound in eager mode, one fused kernel under ``torch.compile``."""
    inner = 0.7978845608 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


def big_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A large square matmul: compute-bound, the case where fusion has nothing to remove."""
    return a @ b


@dataclass(frozen=True)
class FixResult:
    """One fix measured against the unfixed code in interleaved paired rounds, with the roofline's prediction."""

    name: str
    wall: str                         # which wall the workload hits: 'memory', 'compute' or 'overhead'
    speedup: float                    # median over rounds of time(before) / time(after)
    predicted_speedup: float          # what the roofline (or the overhead fit) says it can be at most
    before_rounds_s: tuple[float, ...]
    after_rounds_s: tuple[float, ...]
    bytes_before: float = 0.0         # bytes moved per call, counted (fusion only)
    bytes_after: float = 0.0

    @property
    def speedup_by_round(self) -> tuple[float, ...]:
        """Each paired round's time(before) / time(after): what a verdict reads round by round."""
        return tuple(b / a for b, a in zip(self.before_rounds_s, self.after_rounds_s))


def counted_bytes(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> tuple[float, float, int]:
    """(bytes moved, FLOPs, operators) of one eager call of ``fn``, counted operator by operator."""
    device = args[0].device
    with OperatorRecorder(device) as rec:
        fn(*args)
    return sum(c.bytes_moved for c in rec.calls), sum(c.flops for c in rec.calls), len(rec.calls)


def compare(before: Callable[[], object], after: Callable[[], object], *, rounds: int, repeats: int,
            device: torch.device) -> tuple[float, list[float], list[float]]:
    """(paired median speed-up, before's round times, after's) from interleaved rounds of median timings."""
    runs = interleaved({"before": lambda: time_fn(before, warmup=1, repeats=repeats, device=device).median_s,
                        "after": lambda: time_fn(after, warmup=1, repeats=repeats, device=device).median_s},
                       rounds=rounds)
    speedup = paired_median(runs["before"], runs["after"])
    return float(speedup or float("nan")), runs["before"], runs["after"]


def fusion_fix(x: torch.Tensor, roofs: Roofs, *, rounds: int = 3, repeats: int = 3) -> FixResult:
    """Compile the elementwise chain: bytes saved counted, the roofline's predicted gain, the measured one."""
    eager_bytes, flops, _ = counted_bytes(tanh_gelu_chain, x)
    fused_bytes = 2.0 * x.numel() * x.element_size()            # read x once, write the result once
    compiled = torch.compile(tanh_gelu_chain)
    compiled(x)                                                  # compile outside the timed rounds
    predicted = roofs.predict_time_s(flops, eager_bytes) / roofs.predict_time_s(flops, fused_bytes)
    speedup, before, after = compare(lambda: tanh_gelu_chain(x), lambda: compiled(x), rounds=rounds,
                                     repeats=repeats, device=x.device)
    return FixResult("torch.compile fuses an elementwise chain", roofs.bound(flops, fused_bytes), speedup,
                     predicted, tuple(before), tuple(after), eager_bytes, fused_bytes)


def compile_matmul_fix(n: int, roofs: Roofs, device: torch.device, *, rounds: int = 3,
                       repeats: int = 3) -> FixResult:
    """Compile a big matmul: compute-bound, so the roofline predicts no gain from fusion (speed-up 1)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    compiled = torch.compile(big_matmul)
    compiled(a, b)
    flops, nbytes = 2.0 * n**3, 3.0 * n * n * a.element_size()
    speedup, before, after = compare(lambda: big_matmul(a, b), lambda: compiled(a, b), rounds=rounds,
                                     repeats=repeats, device=device)
    return FixResult("torch.compile on a big matmul", roofs.bound(flops, nbytes), speedup, 1.0,
                     tuple(before), tuple(after), nbytes, nbytes)


def cuda_graph_fix(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, rounds: int = 3,
                   repeats: int = 10) -> FixResult:
    """CUDA graphs on an overhead-bound forward + backward (the kit's step without an optimizer): one replay
    instead of a launch per kernel (GPU only)."""
    if x.device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError("CUDA graphs need a CUDA GPU; on a CPU there are no kernel launches to batch up")
    model = model.to(x.device).train()
    # make_graphed_callables replaces a module's forward in place: graph a copy, so the eager side stays eager
    graphed = torch.cuda.make_graphed_callables(copy.deepcopy(model), (x,))
    eager, replay = TrainStep(model, None, device=x.device), TrainStep(graphed, None, device=x.device)
    speedup, before, after = compare(lambda: eager(x, y), lambda: replay(x, y), rounds=rounds, repeats=repeats,
                                     device=x.device)
    return FixResult("CUDA graphs replay the step's kernels", "overhead", speedup, float("nan"),
                     tuple(before), tuple(after))


def roof_raise(roofs: Roofs, faster: str, baseline: str = "fp32") -> float | None:
    """How many times higher the ``faster`` math mode's measured matmul roof is (None if either is missing)."""
    if faster not in roofs.compute or baseline not in roofs.compute:
        return None
    return roofs.compute[faster].median / roofs.compute[baseline].median
