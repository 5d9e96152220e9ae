"""Notebook 17's "write the distributed code" exercise: an overlapping all-reduce hook for DDP, judged on live ranks.

The learner writes ``hook(state, bucket)`` for ``DistributedDataParallel.register_comm_hook``. The judge
(:mod:`labkit.comm.rank_answers`) runs it on 2 gloo ranks: a seeded MLP per case (:func:`hook_case`), one step, every
rank's gradients compared with DDP's default hook's (``allreduce_hook``, torch's own) beside the typical mistakes':
the sum not divided by the world size, and the rank's own un-reduced buffer. A right answer is then timed
(:func:`measure_overlap`): backward with no communication, with DDP's default hook, with the rival "no overlap" (a
hook that waits for its all-reduce before returning) and with the learner's, in interleaved rounds. The exposed
communication is backward's time past the no-communication one (Li et al. 2020, arXiv:2006.15704, section 3.2.3).
"""
import contextlib
import random
import statistics
from dataclasses import asdict
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from labkit.cluster.link_jobs import join_node_group
from labkit.cluster.nodes import EmulatedNodes, NodesConfig, namespace_support
from labkit.cluster.rankside import job_params, report
from labkit.cluster.run import JobFailed, run_job
from labkit.comm.rank_answers import RankExercise, ShippedAnswer, call_answer, load_answer
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.exercises import Mistake
from labkit.core.step import TrainStep
from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE, Load, Verdict, judge_at_most, median_bounds, \
    relative_spread
from labkit.parallel.overlap.link_runs import LINK_RATE_MBIT_S
from labkit.parallel.overlap.runs import OverlapConfig, build_mlp, rank_batch

TIMING = OverlapConfig(width=256, depth=8, batch=1024, rounds=20)  # link_runs' model: 2.1 MB of gradients, backward
TIMING_CAP_MB = 0.25                        # about 15 ms on a quiet core, an all-reduce about 45 ms at LINK_RATE_MBIT_S;
TIMING_TIMEOUT_S = 120.0                    # 0.25 MB buckets: about one per layer, the first ready early
VARIANTS = ("none", "default", "waiting", "answer")
CLAIM = ("your hook hides communication behind backward: its exposed time is at most the midpoint between DDP's "
         "default hook's and the rival 'no overlap' (a hook that waits for its all-reduce)")


def overlap_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one bucket over the ranks without blocking backward: launch the all-reduce, divide when it lands."""
    world_size = dist.get_world_size()
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(world_size))


def summed_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mistake: the all-reduce's sum, never divided by the world size."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


def local_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mistake: the rank's own gradients, handed back without any all-reduce."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def waiting_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mistake: right gradients, but backward stops until each bucket has crossed the link."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    dist.all_reduce(buffer)
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def _ddp_with(hook: Callable[..., Any], cfg: OverlapConfig, bucket_cap_mb: float) -> nn.Module:
    """DDP over the seeded MLP with ``hook``, behind a check of what it returns (DDP's C++ crashes the process on a
    None where a Future belongs: a TypeError is the learner's one line)."""
    def checked_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut = hook(state, bucket)
        if not (callable(getattr(fut, "then", None)) and callable(getattr(fut, "value", None))):   # a Future's API
            raise TypeError(f"the hook returned {type(fut).__name__}, not a torch.futures.Future: return "
                            "work.get_future() (or its .then(...)) from dist.all_reduce(..., async_op=True)")
        return fut
    ddp = nn.parallel.DistributedDataParallel(build_mlp(cfg), bucket_cap_mb=bucket_cap_mb)
    ddp.register_comm_hook(None, checked_hook)
    return ddp


def hook_case(hook: Callable[..., Any], width: int, depth: int, batch: int, bucket_cap_mb: float,
              seed: int) -> list[float]:
    """In a rank: one step of a seeded MLP under DDP with ``hook``; this rank's gradients, flattened."""
    cfg = OverlapConfig(width=width, depth=depth, batch=batch, seed=seed)
    x, y = rank_batch(cfg, dist.get_rank(), dist.get_world_size())
    ddp, grads = _ddp_with(hook, cfg, bucket_cap_mb), []
    TrainStep(ddp, None, loss_fn=nn.functional.mse_loss,
              grad_hook=lambda m: grads.extend(torch.cat([p.grad.reshape(-1) for p in m.parameters()]).tolist()))(x, y)
    return grads


def hook_cases(seed: int = 171) -> list[dict]:
    """Two seeded cases: small MLPs, tiny buckets (one per parameter) or one big one."""
    rng = random.Random(seed)
    return [{"width": rng.choice([8, 12, 16]), "depth": rng.randint(2, 4), "batch": rng.choice([4, 6, 8]),
             "bucket_cap_mb": cap, "seed": rng.randrange(1000)} for cap in (0.0005, rng.choice([0.002, 25.0]))]


def _backward_s(ddp: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """One step; the seconds its backward took (DDP's backward ends when every bucket's future has completed)."""
    marks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        start = now_s()
        yield
        marks[name] = now_s() - start
    TrainStep(ddp, None, loss_fn=nn.functional.mse_loss)(x, y, phase=phase)
    return marks["backward"]


def time_hooks(shipped: ShippedAnswer, cfg: OverlapConfig, bucket_cap_mb: float) -> dict:
    """In a rank of a started group: backward seconds of each variant (``VARIANTS``) per round, rotated, each after
    a barrier, and this rank's CPU share."""
    x, y = rank_batch(cfg, dist.get_rank(), dist.get_world_size())
    hooks = {"none": local_hook, "default": allreduce_hook, "waiting": waiting_hook, "answer": load_answer(shipped)}
    models = {n: _ddp_with(h, cfg, bucket_cap_mb) for n, h in hooks.items()}
    for n in VARIANTS:                                          # warm-up: DDP rebuilds its buckets after step 1
        for _ in range(2):
            call_answer(shipped, "timing warm-up", _backward_s, models[n], x, y)
    out: dict[str, list[float]] = {n: [] for n in VARIANTS}
    with ShareMeter() as meter:
        for r in range(cfg.rounds):
            for n in VARIANTS[r % 4:] + VARIANTS[:r % 4]:
                dist.barrier()
                out[n].append(call_answer(shipped, "timing", _backward_s, models[n], x, y))
    return {"rank": dist.get_rank(), "cpu_share": meter.share, "backward_s": out}


def hook_link_job() -> dict:
    """One rank of the timing job on two emulated nodes (run by :func:`measure_overlap`): :func:`time_hooks`."""
    me = join_node_group()
    params = job_params()
    cfg = OverlapConfig(**{**params["config"], "caps_bytes": (0,)})
    return report(time_hooks(ShippedAnswer(**params["answer"]), cfg, float(params["cap_mb"])), me.rank)


def overlap_verdict(results: list[dict]) -> Verdict:
    """The answer's backward against the midpoint of DDP's default hook's and the waiting hook's, paired per round
    (a round's figure is its slowest rank's); INCONCLUSIVE when the default hook hid nothing this run can resolve."""
    rounds = len(results[0]["backward_s"]["none"])
    b = {n: [max(r["backward_s"][n][i] for r in results) for i in range(rounds)] for n in VARIANTS}
    hidden_ms = [1e3 * (w - d) for w, d in zip(b["waiting"], b["default"])]
    mid = [(d + w) / 2 for d, w in zip(b["default"], b["waiting"])]   # the midpoint rule, as report.py
    ratios = [a / m for a, m in zip(b["answer"], mid)]
    load = Load.of_ranks(results, spread=relative_spread(ratios))
    exposed = {n: 1e3 * statistics.median(x - z for x, z in zip(b[n], b["none"])) for n in VARIANTS[1:]}
    figures = (f"exposed: yours {exposed['answer']:.2f} ms, DDP's default {exposed['default']:.2f} ms, the rival's "
               f"{exposed['waiting']:.2f} ms, {rounds} paired rounds")
    low, _ = median_bounds(hidden_ms)
    if low <= 0:            # the median's 95% interval of (waiting - default) reaches 0: overlap not resolved here
        return Verdict(CLAIM, INCONCLUSIVE, f"{figures}; DDP's default hook hid no communication this run can "
                                            f"resolve from the rival's ({load.reason()})")
    verdict = judge_at_most(CLAIM, 1e3 * statistics.median(b["answer"]), 1e3 * statistics.median(mid), load=load,
                            unit=" ms backward", by_round=list(zip(b["answer"], mid)))
    return Verdict(CLAIM, verdict.state, f"{figures}; {verdict.detail}")


def measure_overlap(shipped: ShippedAnswer) -> tuple[str, Mistake | None]:
    """Time the learner's hook on two emulated nodes joined by a shaped link; (the verdict's line, the 'waited'
    mistake when it failed). Not judged where no network namespace can be made: on loopback the all-reduce is CPU
    work that competes with backward, so no timing claim is made there (notebook 17, section 2)."""
    how, why = namespace_support()
    if how is None:
        return f"overlap NOT CHECKED: {why}; on loopback the all-reduce competes with backward for the cores", None
    params = {"answer": asdict(shipped), "config": asdict(TIMING), "cap_mb": TIMING_CAP_MB}
    try:
        with EmulatedNodes(NodesConfig(nodes=2, rate_mbit_s=LINK_RATE_MBIT_S)) as nodes:
            results = run_job(nodes, f"{__name__}:hook_link_job", nproc_per_node=1, params=params,
                              timeout_s=TIMING_TIMEOUT_S).results
    except (JobFailed, TimeoutError, OSError) as err:
        return f"overlap NOT CHECKED: the timing run failed ({(str(err).splitlines() or [''])[0][:200]})", None
    verdict = overlap_verdict(results)
    label = {CHECKED: "overlap checked", FAILED: "overlap FAILED", INCONCLUSIVE: "overlap INCONCLUSIVE"}[verdict.state]
    return f"{label}: {verdict.detail}", WAITING if verdict.state == FAILED else None


WAITING = Mistake("waited", waiting_hook, "your gradients are right but backward waits for every bucket: the rival "
                  "'no overlap'. Launch with async_op=True and return work.get_future() (divide in .then(...)); "
                  "never call .wait() or a blocking all_reduce inside the hook")
OVERLAP_HOOK = RankExercise(
    "overlap_hook", "write hook(state, bucket) for DDP's register_comm_hook: average the bucket's gradients over the "
    "ranks without blocking backward, and return a torch.futures.Future holding the averaged tensor",
    overlap_hook, allreduce_hook, hook_case, hook_cases,
    (Mistake("summed", summed_hook, "that is the sum over the ranks, the rival 'sum without dividing': DDP expects the "
             "mean, so divide by dist.get_world_size()"),
     Mistake("rank_local", local_hook, "those are this rank's own gradients, the rival 'rank-local grads': the "
             "bucket was never all-reduced, so the ranks' models drift apart")),
    "launch dist.all_reduce(bucket.buffer(), async_op=True), then return work.get_future().then(lambda fut: "
    "fut.value()[0] / dist.get_world_size())", measure=measure_overlap)
