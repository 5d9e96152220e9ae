"""Notebook 05's and 05b's "write the distributed code" exercises, judged on live ranks.

05, ``pipeline_forward(stage, x)``: a two-stage forward with ``dist.send``/``dist.recv`` on 2 gloo ranks. Per case
(:func:`stage_case`) the seeded MLP of :func:`labkit.parallel.pipeline.model_parallel.build_stages` is cut into two
stages, rank r gets stage r and every rank the same input batch; every hidden layer is as wide as the input, so the
activation has the input's shape. Expected: the unsplit model in one process (:func:`unsplit_forward`); rivals: no
split, and rank 1 running its stage on its own input. :func:`on_ranks` runs a cell's own function on 2 ranks.

05b, ``one_f_one_b_step(stage, stage_index, num_stages, inputs, targets)``: one training step of p = 2 or 3 stages
in the 1F1B order (PipeDream-Flush, Narayanan et al. 2021), activations down and their gradients up with
``dist.isend``/``dist.recv``, judged on 3 gloo ranks (a 2-stage case leaves rank 2 out). Per case
(:func:`step_case`) the stage is a :class:`RecordedStage` that notes each forward and each backward as it runs; a
rank's output is its gradients and that order. Expected (:func:`one_process_step`): the unsplit model stepped in one
process in the kit's 1F1B order (torch's ``Schedule1F1B`` order, checked live in 05b). Rivals: GPipe's order
(right gradients, m micro-batches in flight instead of p - r), the loss not divided by m, the gradients not
accumulated. Correctness only: no timing.
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
from labkit.parallel.pipeline.schedule_sim import gpipe_order, one_f_one_b_order, peak_in_flight


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


# ------------------------------------------------------------------------------------ 05b: the 1F1B loop
def one_f_one_b_step(stage: torch.nn.Module, stage_index: int, num_stages: int, inputs: list, targets: list) -> None:
    """One training step of this rank's stage under 1F1B: p-1-r warm-up forwards, then a forward and a backward in
    turn, then the remaining backwards; the loss is averaged over the m micro-batches, the gradients accumulate."""
    r, p, m = stage_index, num_stages, len(inputs)
    held, sends = {}, []                          # micro-batch -> (its input, its output); the pending sends

    def forward(i):
        if r == 0:
            x = inputs[i]
        else:
            x = torch.empty_like(inputs[i])       # every activation has the input's shape
            dist.recv(x, src=r - 1)
            x.requires_grad_()                    # its gradient goes back up to rank r - 1
        out = stage(x)
        if r < p - 1:                             # isend: a blocking send would meet rank r+1's blocking send
            sends.append(dist.isend(out.detach(), dst=r + 1))
        held[i] = (x, out)

    def backward(i):
        x, out = held.pop(i)                      # micro-batch i's activations are freed after this
        if r == p - 1:
            (torch.nn.functional.mse_loss(out, targets[i]) / m).backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=r + 1)
            out.backward(grad)                    # accumulates into the stage's .grad
        if r > 0:
            sends.append(dist.isend(x.grad, dst=r - 1))

    warmup = min(p - 1 - r, m)
    for i in range(warmup):
        forward(i)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for i in range(m - warmup, m):
        backward(i)
    for work in sends:
        work.wait()


class _MarkBackward(torch.autograd.Function):
    """Identity on a stage's output that notes 'B<i>' when micro-batch i's gradient reaches it."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, order: list, i: int) -> torch.Tensor:
        ctx.order, ctx.i = order, i
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        ctx.order.append(f"B{ctx.i}")
        return grad, None, None


class RecordedStage(nn.Module):
    """A rank's stage that notes its actions in ``order``: 'F<i>' at the i-th forward, 'B<i>' when that output's
    gradient arrives; ``split_config`` and ``stage_index`` place it in the case's model (one seed, one set of
    weights, however the model is cut)."""

    def __init__(self, inner: nn.Module, split_config: SplitConfig, stage_index: int) -> None:
        super().__init__()
        self.inner, self.split_config, self.stage_index, self.order = inner, split_config, stage_index, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stage on ``x``, noted as the next micro-batch's forward."""
        i = sum(a[0] == "F" for a in self.order)
        self.order.append(f"F{i}")
        return _MarkBackward.apply(self.inner(x), self.order, i)


def _step_in_order(stage: nn.Module, order: list[str], inputs: list, targets: list, loss_divisor: int,
                   zero_before_backward: bool = False) -> None:
    """Run ``order`` (['F0', 'B0', ...]) on the unsplit model in one process, no message sent: the model built again
    from the case's seed, this rank's ``stage`` in its place; each loss divided by ``loss_divisor``."""
    stages: list[nn.Module] = list(build_stages(stage.split_config))
    stages[stage.stage_index] = stage
    whole, losses = nn.Sequential(*stages), {}
    for action in order:
        i = int(action[1:])
        if action[0] == "F":
            losses[i] = nn.functional.mse_loss(whole(inputs[i]), targets[i]) / loss_divisor
            continue
        if zero_before_backward:
            stage.zero_grad()
        losses.pop(i).backward()


def one_process_step(stage: nn.Module, stage_index: int, num_stages: int, inputs: list, targets: list) -> None:
    """The kit's expected answer: the unsplit model steps in one process, its micro-batches taken in this rank's
    1F1B order from :func:`~labkit.parallel.pipeline.schedule_sim.one_f_one_b_order` (torch's Schedule1F1B order,
    checked live in notebook 05b), each loss divided by m."""
    m = len(inputs)
    _step_in_order(stage, one_f_one_b_order(num_stages, stage_index, m), inputs, targets, m)


def gpipe_step(stage: nn.Module, stage_index: int, num_stages: int, inputs: list, targets: list) -> None:
    """Mistake: every forward, then every backward (GPipe): right gradients, m micro-batches in flight."""
    _step_in_order(stage, gpipe_order(len(inputs)), inputs, targets, len(inputs))


def summed_loss_step(stage: nn.Module, stage_index: int, num_stages: int, inputs: list, targets: list) -> None:
    """Mistake: the 1F1B order, but no micro-batch's loss is divided by m (gradients m times too big)."""
    _step_in_order(stage, one_f_one_b_order(num_stages, stage_index, len(inputs)), inputs, targets, 1)


def last_only_step(stage: nn.Module, stage_index: int, num_stages: int, inputs: list, targets: list) -> None:
    """Mistake: the gradients are zeroed before every backward, so only the last micro-batch's remain."""
    m = len(inputs)
    _step_in_order(stage, one_f_one_b_order(num_stages, stage_index, m), inputs, targets, m, True)


def step_case(answer: Callable[..., Any], width: int, batch: int, stages: int, micro_batches: int,
              seed: int) -> dict | None:
    """In a rank: the seeded MLP cut into ``stages`` stages of one layer, this rank's as a :class:`RecordedStage`,
    ``micro_batches`` input and target batches (the same on every rank); after the answer's step, the micro-batches
    this stage held at its peak, its order and its gradients. None on a rank the case leaves out."""
    rank = dist.get_rank()
    if rank >= stages:
        return None
    cfg = SplitConfig(in_features=width, hidden=width, layers_per_stage=1, num_classes=4, stages=stages, seed=seed)
    stage = RecordedStage(build_stages(cfg)[rank], cfg, rank)
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = [torch.randn(batch, width, generator=gen) for _ in range(micro_batches)]
    targets = [torch.randn(batch, cfg.num_classes, generator=gen) for _ in range(micro_batches)]
    answer(stage, rank, stages, inputs, targets)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in stage.parameters()]
    return {"in flight": peak_in_flight(stage.order), "order": " ".join(stage.order),
            "grads": torch.cat([g.reshape(-1) for g in grads]).tolist()}


def step_cases(seed: int = 52) -> list[dict]:
    """Three seeded cases: p = 2 with m > p, p = 3 with m = p, p = 3 with m > p (each well under a second)."""
    rng = random.Random(seed)
    shapes = [(2, rng.randint(3, 5)), (3, 3), (3, rng.randint(4, 6))]
    return [{"width": rng.choice([4, 6, 8]), "batch": rng.randint(2, 4), "stages": p, "micro_batches": m,
             "seed": rng.randrange(1000)} for p, m in shapes]


ONE_F_ONE_B_STEP = RankExercise(
    "one_f_one_b_step", "write one_f_one_b_step(stage, stage_index, num_stages, inputs, targets): one training step "
    "of this rank's stage in the 1F1B order (p-1-r warm-up forwards, then one forward and one backward in turn, then "
    "the remaining backwards); activations go down with dist.isend/dist.recv, their gradients come back up; the last "
    "stage's loss is mse_loss(output, targets[i]) / m and the gradients accumulate over the m micro-batches",
    one_f_one_b_step, one_process_step, step_case, step_cases,
    (Mistake("gpipe", gpipe_step, "your gradients are right, but this is the rival 'GPipe order': every forward "
             "before any backward holds all m micro-batches' activations. Under 1F1B rank r runs p-1-r warm-up "
             "forwards, then a forward and a backward in turn, so it never holds more than p - r"),
     Mistake("loss_not_over_m", summed_loss_step, "your gradients are m times too big, the rival 'loss not divided "
             "by m': the step's loss is the mean over the m micro-batches, so divide each micro-batch's loss by m"),
     Mistake("not_accumulated", last_only_step, "only the last micro-batch's gradients are left, the rival 'no "
             "accumulation': backward adds into .grad, so zero the gradients once before the step, never between "
             "micro-batches")),
    "keep each micro-batch's input and output until its backward; rank r: p-1-r forwards, then forward(i + warm-up) "
    "and backward(i) in turn, then the last backwards; dist.isend each activation down and each input's .grad up, "
    "dist.recv into torch.empty_like buffers, and wait() on the sends at the end",
    world_size=3, case_s=5.0)
