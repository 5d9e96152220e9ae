"""Tensor parallelism against data parallelism and ZeRO-3 on one node, for the same layer and global batch: what
each rank holds (parameters, gradients, Adam's state, saved activations) and how long a step takes, measured.

DP and ZeRO-3 (FSDP2's ``fully_shard``, Rajbhandari et al. 2020) split the batch: each rank runs the whole layer on
b/t samples. TP and TP + SP split the layer: each rank runs 1/t of it on all b samples. Steps are timed in
interleaved rounds (each round runs every strategy once, in a rotated order, between barriers), so a busy moment
slows all of them alike; each rank's CPU share over the rounds is measured (``labkit.core.contention``).
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.step import StepOptions, TrainStep
from labkit.core.verdict import Load, relative_spread
from labkit.parallel.data.sync_sgd import sync_gradients
from labkit.parallel.tensor.megatron import LayerShape, ParallelBlock, build_block
from labkit.parallel.tensor.cost import SavedBytes
from labkit.parallel.tensor.runs import layer_inputs, probe_loss
from labkit.sharding.memory import count_rank_state_bytes

STRATEGIES = ("dp", "zero3", "tp", "tp_sp")


def _strategy(name: str, block: nn.Module, x: torch.Tensor, probe: torch.Tensor) -> tuple[nn.Module, tuple, object]:
    """(model, (input, probe) this rank feeds it, grad hook) for one strategy."""
    rank, t = dist.get_rank(), dist.get_world_size()
    if name in ("tp", "tp_sp"):
        sp = name == "tp_sp"
        model = ParallelBlock(block, rank, t, sequence_parallel=sp)
        feed = tuple(v.chunk(t, dim=1)[rank].contiguous() for v in (x, probe)) if sp else (x, probe)
        params = model.replicated_parameters()
        hook = (lambda m: [dist.all_reduce(p.grad) for p in params]) if sp else None
        return model, feed, hook
    feed = tuple(v.chunk(t, dim=0)[rank].contiguous() for v in (x, probe))      # the batch split
    model = copy.deepcopy(block)
    if name == "zero3":
        return fully_shard(model, reshard_after_forward=True), feed, None
    return model, feed, lambda m: sync_gradients(m, dist.all_reduce, t, bucket=True)


def _held(model: nn.Module, opt: torch.optim.Optimizer, feed: tuple) -> dict[str, int]:
    """Bytes this rank holds after a step (parameters, gradients, Adam) and keeps for backward in one forward."""
    state = count_rank_state_bytes(model.parameters(), opt)
    norms = [m for n, m in model.named_modules() if n in ("ln1", "ln2")]
    recorder = SavedBytes(model, norms)
    with recorder.recording():
        model(feed[0].clone().requires_grad_())
    return {**{k: state[k] for k in ("params", "grads", "optimizer")}, "activations": sum(recorder.totals().values())}


def compare_worker(shape_dict: dict, rounds: int = 5, seed: int = 0) -> dict:
    """Run inside ``launch``: every strategy built, stepped once to warm up, counted, then timed in rounds."""
    torch.set_num_threads(1)
    shape, device = LayerShape(**shape_dict), rank_device()
    t = shape.check_split(dist.get_world_size())
    if shape.batch % t:
        raise ValueError(f"data parallelism splits the batch of {shape.batch} over {t} ranks: make it divisible")
    block = build_block(shape, seed).to(device)
    x, probe = (v.to(device) for v in layer_inputs(shape, seed + 1))
    steps, feeds, held = {}, {}, {}
    for name in STRATEGIES:
        model, feed, hook = _strategy(name, block, x, probe)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        steps[name] = TrainStep(model, opt, loss_fn=probe_loss, device=device, grad_hook=hook,
                                options=StepOptions(set_to_none=False))
        feeds[name] = feed
        steps[name](*feed)                                           # warm-up: Adam's state exists after it
        held[name] = _held(model, opt, feed)
    times: dict[str, list[float]] = {n: [] for n in STRATEGIES}
    with ShareMeter() as meter:
        for r in range(rounds):
            for name in STRATEGIES[r % len(STRATEGIES):] + STRATEGIES[:r % len(STRATEGIES)]:
                dist.barrier()
                start = now_s()
                steps[name](*feeds[name])
                dist.barrier()
                times[name].append(now_s() - start)
    return {"rank": dist.get_rank(), "world_size": t, "held": held, "times_s": times, "cpu_share": meter.share}


def run_comparison(shape: LayerShape, world_size: int, rounds: int = 5, timeout_s: float = 120.0,
                   backend: str = "auto") -> list[dict]:
    """Launch the comparison on ``world_size`` real processes; one result per rank."""
    shape.check_split(world_size)
    return launch(compare_worker, world_size, args=(asdict(shape), rounds), timeout_s=timeout_s, show_output=False,
                  backend=backend)


def comparison_rows(ranks: list[dict]) -> list[dict]:
    """One row per strategy: the most any rank holds of each part, and the median step time over ranks' rounds."""
    rows = []
    for name in STRATEGIES:
        held = {k: max(r["held"][name][k] for r in ranks) for k in ("params", "grads", "optimizer", "activations")}
        per_round = [max(r["times_s"][name][i] for r in ranks) for i in range(len(ranks[0]["times_s"][name]))]
        rows.append({"strategy": name, **held, "total": sum(held.values()),
                     "step_ms": 1e3 * statistics.median(per_round)})
    return rows


def step_ratios(ranks: list[dict], slower: str = "tp", faster: str = "dp") -> list[float]:
    """``slower``'s step over ``faster``'s, round by round (each round's figure is its slowest rank's): the paired
    rounds a timing verdict reads."""
    return [max(r["times_s"][slower][i] for r in ranks) / max(r["times_s"][faster][i] for r in ranks)
            for i in range(len(ranks[0]["times_s"][faster]))]


def comparison_load(ranks: list[dict]) -> Load:
    """How busy the timed rounds were: each rank's CPU share, and the spread of TP's per-round time over DP's."""
    return Load.of_ranks(ranks, spread=relative_spread(step_ratios(ranks)))
