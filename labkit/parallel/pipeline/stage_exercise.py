"""Notebook 05's "write the distributed code" exercise: a two-stage forward pass with ``dist.send``/``dist.recv``,
judged on live ranks.

The learner writes ``pipeline_forward(stage, x)``. The judge (:mod:`labkit.comm.rank_answers`) runs it on 2 gloo
ranks: per case (:func:`stage_case`) the seeded MLP of :func:`labkit.parallel.pipeline.model_parallel.build_stages`
is cut into two stages, rank r gets stage r and every rank gets the same input batch (as a data loader gives every
stage the batch). Every hidden layer is as wide as the input, so the activation has the input's shape and dtype.
The outputs are compared with the kit's expected answer, the unsplit model run in one process
(:func:`unsplit_forward`), beside the typical mistakes': no split (every rank computes on the input) and rank 1
running its stage on its own input instead of the received activation. Correctness only: no timing.
:func:`on_ranks` runs a function written in a notebook cell on 2 ranks, for the page's send/recv example.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from labkit.comm.launch import launch
from labkit.comm.rank_answers import RankExercise, ShippedAnswer, call_answer, load_answer, ship_answer
from labkit.core.exercises import Mistake
from labkit.parallel.pipeline.model_parallel import SplitConfig, build_stages


def pipeline_forward(stage: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """One forward pass of a model cut into two stages on two ranks; the output on the last rank, None on rank 0."""
    if dist.get_rank() == 0:
        dist.send(stage(x), dst=1)                 # the activation goes down the pipeline; rank 0 is done
        return None
    activation = torch.empty_like(x)               # the receiver allocates the buffer: same shape and dtype as x
    dist.recv(activation, src=0)                   # blocks until rank 0's activation has arrived
    return stage(activation)


def unsplit_forward(stage: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The kit's expected answer: every rank's stage gathered to the last rank, which runs the unsplit model
    (``nn.Sequential`` of the stages) in one process; None on the other ranks."""
    stages: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(stages, stage)          # pickled modules: the same weights, bit for bit
    last = dist.get_rank() == dist.get_world_size() - 1
    return nn.Sequential(*stages)(x) if last else None


def every_rank_on_input(stage: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """Mistake: no split; every rank runs what it holds on the input and returns it, and nothing is sent."""
    return stage(x)


def own_input_on_rank_1(stage: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """Mistake: the activation is sent and received, but rank 1 runs its stage on its own input x."""
    if dist.get_rank() == 0:
        dist.send(stage(x), dst=1)
        return None
    activation = torch.empty_like(x)
    dist.recv(activation, src=0)
    return stage(x)


def stage_case(answer: Callable[..., Any], width: int, layers_per_stage: int, batch: int, seed: int) -> list | None:
    """In a rank: the seeded two-stage MLP, this rank's stage and the shared input batch; the answer's output as a
    nested list (None where it returned None)."""
    cfg = SplitConfig(in_features=width, hidden=width, layers_per_stage=layers_per_stage, stages=2, seed=seed)
    stage = build_stages(cfg)[dist.get_rank()]
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 1))   # the same batch on every rank
    with torch.no_grad():
        out = answer(stage, x)
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"pipeline_forward returned {type(out).__name__} on rank {dist.get_rank()}: return the "
                        "output tensor on the last rank and None on the others")
    return None if out is None else out.tolist()


def stage_cases(seed: int = 50) -> list[dict]:
    """Three seeded cases: a few narrow layers per stage, a small batch (each well under a second)."""
    rng = random.Random(seed)
    return [{"width": rng.choice([4, 8, 16]), "layers_per_stage": rng.randint(1, 2), "batch": rng.randint(2, 5),
             "seed": rng.randrange(1000)} for _ in range(3)]


def _run_shipped(shipped: ShippedAnswer, kwargs: dict) -> Any:
    """In a rank: the notebook's function, loaded from its shipped source and called with ``kwargs``."""
    return call_answer(shipped, "on_ranks", load_answer(shipped), **kwargs)


def on_ranks(fn: Callable[..., Any], world_size: int = 2, timeout_s: float = 60.0, **kwargs: Any) -> list:
    """Run a function written in a notebook cell on ``world_size`` gloo ranks under the launcher's timeout; each
    rank's return value, in rank order. Its source travels alone (only ``torch`` and ``dist`` are given)."""
    with ship_answer(fn) as shipped:
        return launch(_run_shipped, world_size, args=(shipped, kwargs), backend="gloo", timeout_s=timeout_s,
                      show_output=False)


PIPELINE_FORWARD = RankExercise(
    "pipeline_forward", "write pipeline_forward(stage, x) for 2 ranks: rank 0 runs its stage on x and sends the "
    "activation to rank 1 with dist.send; rank 1 receives it into a buffer shaped like x (dist.recv) and runs its "
    "stage on it; return the output on the last rank, None on rank 0",
    pipeline_forward, unsplit_forward, stage_case, stage_cases,
    (Mistake("no_split", every_rank_on_input, "no activation crossed between the ranks: that is the rival 'no "
             "split', every rank computing on the input as if it held the whole model. Rank 0 must dist.send "
             "stage(x) to rank 1 and return None"),
     Mistake("own_input", own_input_on_rank_1, "rank 1 ran its stage on its own input x, the rival 'stage on its "
             "own input': the received activation is what stage 1 must see, so return stage(activation)")),
    "on rank 0: dist.send(stage(x), dst=1) and return None; on rank 1: buf = torch.empty_like(x), "
    "dist.recv(buf, src=0), return stage(buf)", case_s=5.0)
