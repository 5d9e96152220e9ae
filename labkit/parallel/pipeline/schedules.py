"""PyTorch's pipeline schedules, for real: GPipe, 1F1B, interleaved, looped BFS, zero bubble, ZBV and DualPipeV
run on real ranks, on the same model and micro-batches, checked against one process and timed action by action.

Each schedule of ``torch.distributed.pipelining`` runs on ``p`` ranks (gloo on CPU, NCCL with a GPU per rank)
through the kit's launcher, with every rank's stages wrapped by :class:`labkit.parallel.pipeline.schedule_trace.StageTracer`.
The model is a stack of equal blocks, cut into ``p`` stages (one per rank) or ``2p`` (two per rank: looped for
interleaved 1F1B (Narayanan et al. SC21), looped BFS and interleaved zero bubble (Qi et al. 2024); V-shaped for
ZBV and DualPipeV), so every schedule trains the same function. The loss and every gradient are compared with
single-process training on the same micro-batches; ``scale_grads`` (default True: the schedule divides the
gradients by the number of micro-batches) is the pitfall shown. Every run is under a timeout; a rank that hangs
or fails names itself and the action it waited on in one line (:class:`PipelineHang`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
from torch import nn

from labkit.comm.launch import LaunchTimeout, RankFailedError, launch
from labkit.comm.worker import rank_device
from labkit.core.validation import checked_int, positive_int
from labkit.parallel.pipeline.schedule_sim import Span, makespan_s
from labkit.parallel.pipeline.schedule_trace import ActivationMeter, Post, StageTracer

# schedule -> (stages per rank, placement of stages on ranks): what each needs, checked by probe_layouts
LAYOUTS = {"ScheduleGPipe": (1, "loop"), "Schedule1F1B": (1, "loop"), "ScheduleInterleaved1F1B": (2, "loop"),
           "ScheduleLoopedBFS": (2, "loop"), "ScheduleInterleavedZeroBubble": (2, "loop"),
           "ScheduleZBVZeroBubble": (2, "v"), "ScheduleDualPipeV": (2, "v")}
SCHEDULES = tuple(LAYOUTS)


class PipelineHang(RuntimeError):
    """A pipeline run that did not finish: one line naming the rank and the action it waited on."""


@dataclass(frozen=True)
class PipeConfig:
    """The model every schedule trains: ``blocks`` equal Linear+Tanh blocks of ``width``, and the data."""

    width: int = 512
    blocks: int = 4
    micro_batch: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("width", "blocks", "micro_batch"):
            positive_int(getattr(self, name), name)


def available_schedules() -> tuple[str, ...]:
    """The schedules this torch ships (DualPipeV and ZBV are recent: older torch lacks them)."""
    return tuple(name for name in SCHEDULES if hasattr(pipelining, name))


def stage_ranks(ranks: int, stages_per_rank: int, style: str) -> list[int]:
    """The rank of each stage: looped (stage s on rank s mod p) or V-shaped (down the ranks, then back up)."""
    p, v = positive_int(ranks, "ranks"), positive_int(stages_per_rank, "stages_per_rank")
    if style == "loop":
        return [s % p for s in range(p * v)]
    if style == "v" and v == 2:
        return list(range(p)) + list(reversed(range(p)))
    raise ValueError(f"style must be 'loop', or 'v' with 2 stages per rank; got {style!r} with {v}")


def build_stage_modules(cfg: PipeConfig, stages: int) -> list[nn.Sequential]:
    """The model cut into ``stages`` equal stages; same seed, same weights, whatever the cut."""
    if cfg.blocks % stages:
        raise ValueError(f"{cfg.blocks} blocks do not split into {stages} equal stages: use a multiple of {stages}")
    torch.manual_seed(cfg.seed)
    blocks = [nn.Sequential(nn.Linear(cfg.width, cfg.width), nn.Tanh()) for _ in range(cfg.blocks)]
    per = cfg.blocks // stages
    return [nn.Sequential(*blocks[i * per:(i + 1) * per]) for i in range(stages)]


def make_batch(cfg: PipeConfig, micro_batches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and regression targets for ``micro_batches`` micro-batches of ``cfg.micro_batch`` samples."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    n = positive_int(micro_batches, "micro_batches") * cfg.micro_batch
    return torch.randn(n, cfg.width, generator=gen), torch.randn(n, cfg.width, generator=gen)


def mse_loss(output: torch.Tensor, target: torch.Tensor, divide_by: int = 1) -> torch.Tensor:
    """Mean squared error of one micro-batch; ``divide_by=m`` is the gradient-accumulation habit (loss / m)."""
    return nn.functional.mse_loss(output, target) / divide_by


def reference(cfg: PipeConfig, micro_batches: int, device: torch.device | str = "cpu"
              ) -> tuple[list[float], list[torch.Tensor]]:
    """Single-process training on the same micro-batches, on ``device`` (a rank's own, so the comparison is not
    CPU against GPU kernels): each micro-batch's loss, and the gradient of their mean (per parameter, in order)."""
    model = nn.Sequential(*build_stage_modules(cfg, 1)).to(device)
    x, y = (t.to(device) for t in make_batch(cfg, micro_batches))
    losses = [mse_loss(model(xi), yi) for xi, yi in zip(x.chunk(micro_batches), y.chunk(micro_batches))]
    grads = torch.autograd.grad(torch.stack(losses).mean(), list(model.parameters()))
    return [float(v.detach()) for v in losses], [g.cpu() for g in grads]


# ---------------------------------------------------------------------------------------------- on each rank
def _build(name: str, cfg: PipeConfig, m: int, rank: int, p: int, device: torch.device,
           loss_fn: Callable[..., torch.Tensor], scale_grads: bool
           ) -> tuple[Any, StageTracer, list[int], list[nn.Module]]:
    """This rank's stages (traced) and the schedule driving them."""
    v, style = LAYOUTS[name]
    placement = stage_ranks(p, v, style)
    modules = build_stage_modules(cfg, p * v)
    mine = [s for s in range(p * v) if placement[s] == rank]
    stages = [pipelining.PipelineStage(modules[s].to(device), s, p * v, device) for s in mine]
    tracer = StageTracer(rank, device, ActivationMeter([q for s in mine for q in modules[s].parameters()]))
    for stage in stages:
        tracer.attach(stage)
    cls = getattr(pipelining, name)
    schedule = cls(stages[0] if v == 1 else stages, m, loss_fn=loss_fn, scale_grads=scale_grads)
    return schedule, tracer, mine, [modules[s] for s in mine]


def _errors(modules: list[nn.Module], mine: list[int], cfg: PipeConfig, ref_grads: list[torch.Tensor],
            stages: int) -> tuple[float, float]:
    """(max relative gradient error, norm ratio pipeline/reference) over this rank's parameters."""
    per = 2 * (cfg.blocks // stages)                     # weight and bias per block
    got, want = [], []
    for module, s in zip(modules, mine):
        got += [q.grad.detach().cpu().flatten() for q in module.parameters()]
        want += [g.flatten() for g in ref_grads[s * per:(s + 1) * per]]
    g, r = torch.cat(got), torch.cat(want)
    return float((g - r).abs().max() / r.abs().max()), float(g.norm() / r.norm())


def run_one(run: dict, cfg: PipeConfig, repeats: int, references: dict | None = None) -> dict:
    """One schedule on this rank: a warm-up step, then ``repeats`` timed steps; spans, memory, messages, errors.
    ``references`` caches the single-process answer per micro-batch count across the runs of one worker."""
    rank, p, device = dist.get_rank(), dist.get_world_size(), rank_device()
    name, m = run["schedule"], run["micro_batches"]
    loss_fn = functools.partial(mse_loss, divide_by=m if run.get("loss_over_m") else 1)
    schedule, tracer, mine, modules = _build(name, cfg, m, rank, p, device, loss_fn, run.get("scale_grads", True))
    x, y = (t.to(device) for t in make_batch(cfg, m))
    first, last = 0 in mine, p * LAYOUTS[name][0] - 1 in mine
    references = {} if references is None else references
    if m not in references:
        references[m] = reference(cfg, m, device)
    ref_losses, ref_grads = references[m]
    result: dict = {"rank": rank, "stages": mine, "repeats": []}
    for rep in range(repeats + 1):
        for module in modules:
            module.zero_grad(set_to_none=True)
        tracer.reset()
        losses: list = []
        dist.barrier()
        try:
            schedule.step(*([x] if first else []), **({"target": y, "losses": losses} if last else {}))
        except Exception as err:  # noqa: BLE001 - any failure inside the schedule is named the same way
            raise PipelineHang(f"rank {rank} of {p}: {name} (m={m}) stopped {tracer.where()} "
                               f"({type(err).__name__}: {str(err).splitlines()[0][:160]})") from err
        if rep:
            result["repeats"].append({"spans": tracer.spans, "posts": tracer.posts, "messages": tracer.messages,
                                      "peak_bytes": tracer.meter.peak_bytes, "message_bytes": tracer.message_bytes,
                                      "cpu_share": tracer.cpu_share()})
    if last:
        result["loss_error"] = max(abs(float(a) * (m if run.get("loss_over_m") else 1) - b)
                                   for a, b in zip(losses, ref_losses))
    result["grad_error"], result["grad_ratio"] = _errors(modules, mine, cfg, ref_grads, p * LAYOUTS[name][0])
    return result


def probe_layouts(cfg: PipeConfig, names: tuple[str, ...]) -> dict[str, dict[int, str]]:
    """On a rank: does each schedule accept 1 and 2 stages per rank? 'ok' or the first line of its refusal."""
    rank, p, device = dist.get_rank(), dist.get_world_size(), rank_device()
    found: dict[str, dict[int, str]] = {}
    for name in names:
        found[name] = {}
        for v in (1, 2):
            modules = build_stage_modules(cfg, p * v)
            placement = stage_ranks(p, v, "v" if LAYOUTS[name][1] == "v" and v == 2 else "loop")
            stages = [pipelining.PipelineStage(modules[s].to(device), s, p * v, device)
                      for s in range(p * v) if placement[s] == rank]
            try:
                getattr(pipelining, name)(stages[0] if v == 1 and LAYOUTS[name][0] == 1 else stages, 2 * p,
                                          loss_fn=mse_loss)
                found[name][v] = "ok"
            except Exception as err:  # noqa: BLE001 - the refusal is the answer
                found[name][v] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return found


def schedules_worker(runs: list[dict], cfg: PipeConfig, repeats: int, probe: bool = True) -> dict:
    """Run inside launch(world_size=p): the layout probe, then every run; this rank's results."""
    torch.set_num_threads(1)
    names, references = tuple(dict.fromkeys(r["schedule"] for r in runs)), {}
    return {"probe": probe_layouts(cfg, names) if probe else {},
            "runs": [run_one(r, cfg, repeats, references) for r in runs]}


# ---------------------------------------------------------------------------------------------- the launcher
@dataclass(frozen=True)
class ScheduleRun:
    """One schedule's live step (the least-disturbed repeat), merged over ranks."""

    schedule: str
    micro_batches: int
    ranks: int
    stages_per_rank: int
    rank_stages: dict[int, list[int]]
    spans: list[Span]
    peak_bytes: dict[int, int]
    messages: int
    message_bytes: int
    cpu_shares: dict[int, float]
    loss_error: float
    grad_error: float
    grad_ratio: float
    scale_grads: bool = True
    loss_over_m: bool = False
    posts: list[Post] = field(default_factory=list)
    makespans_s: tuple[float, ...] = ()     # every timed repeat's makespan, the kept one included
    rounds: tuple[tuple[list[Span], list[Post]], ...] = ()   # every timed repeat's (spans, posts), all ranks


def _merge(run: dict, per_rank: list[dict]) -> ScheduleRun:
    """Pick the repeat with the shortest makespan over all ranks (other work only ever stretches a run); keep every
    repeat's makespan, whose spread says how disturbed the steps were, and its actions, for paired replays."""
    n = len(per_rank[0]["repeats"])
    makespans = [makespan_s([s for r in per_rank for s in r["repeats"][i]["spans"]]) for i in range(n)]
    best = min(range(n), key=makespans.__getitem__)
    reps = [r["repeats"][best] for r in per_rank]
    return ScheduleRun(run["schedule"], run["micro_batches"], len(per_rank), LAYOUTS[run["schedule"]][0],
                       {r["rank"]: r["stages"] for r in per_rank}, [s for rep in reps for s in rep["spans"]],
                       {r["rank"]: rep["peak_bytes"] for r, rep in zip(per_rank, reps)},
                       sum(rep["messages"] for rep in reps), sum(rep["message_bytes"] for rep in reps),
                       {r["rank"]: rep["cpu_share"] for r, rep in zip(per_rank, reps)},
                       max(r.get("loss_error", 0.0) for r in per_rank), max(r["grad_error"] for r in per_rank),
                       max(r["grad_ratio"] for r in per_rank), run.get("scale_grads", True),
                       bool(run.get("loss_over_m")), [p for rep in reps for p in rep["posts"]], tuple(makespans),
                       tuple(([s for r in per_rank for s in r["repeats"][i]["spans"]],
                              [p for r in per_rank for p in r["repeats"][i]["posts"]]) for i in range(n)))


def run_schedules(runs: list[dict], cfg: PipeConfig | None = None, *, ranks: int = 2, repeats: int = 2,
                  timeout_s: float = 120.0, pg_timeout_s: float = 30.0, probe: bool = True,
                  worker: Callable[..., dict] = schedules_worker
                  ) -> tuple[list[ScheduleRun], dict[str, dict[int, str]]]:
    """Every run ({'schedule', 'micro_batches'[, 'scale_grads', 'loss_over_m']}) on ``ranks`` real processes, and
    what each schedule accepts as stages per rank. A stuck or failing rank raises PipelineHang with one line.
    ``worker`` is what each rank runs (a module-level function taking :func:`schedules_worker`'s arguments): a lab
    that provokes a fault wraps it."""
    cfg = cfg or PipeConfig()
    ranks = checked_int(ranks, "ranks", minimum=2, hint="a pipeline splits the model over at least 2 ranks")
    for run in runs:        # every argument checked here, before any rank starts
        if run["schedule"] not in available_schedules():
            raise ValueError(f"{run['schedule']!r} is not in this torch ({torch.__version__}); it has "
                             f"{available_schedules()}")
        stages = ranks * LAYOUTS[run["schedule"]][0]
        m = positive_int(run.get("micro_batches"), "micro_batches", hint="a step splits its batch into m micro-batches")
        if run["schedule"] == "Schedule1F1B" and m < stages:      # torch's own rule for 1F1B, said up front
            raise ValueError(f"Schedule1F1B needs micro_batches >= its {stages} stages (its warm-up fills every "
                             f"stage), got {m}")
        build_stage_modules(cfg, stages)    # the cut must work: say so before launching
    try:
        per_rank = launch(worker, ranks, kwargs=dict(runs=runs, cfg=cfg, repeats=positive_int(
            repeats, "repeats"), probe=probe), timeout_s=timeout_s,
                          pg_timeout_s=pg_timeout_s, show_output=False)
    except RankFailedError as err:
        raise PipelineHang(err.summary) from None
    except LaunchTimeout:
        raise PipelineHang(f"no rank finished within {timeout_s:.0f} s and none reported an error: every process "
                           "was stopped") from None
    merged = [_merge(run, [r["runs"][j] for r in per_rank]) for j, run in enumerate(runs)]
    return merged, per_rank[0]["probe"]
