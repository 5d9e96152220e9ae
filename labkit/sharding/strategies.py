"""Sharded data parallelism on real processes: DDP, a hand-written ZeRO-1, and FSDP2 as ZeRO-2 and ZeRO-3.

Every strategy trains the same float64 MLP on the same global batches as one process would (float64 so the
"same answer" check can be 1e-6 after Adam's division by sqrt(v)). Each rank reports the weights it ends
with, the model-state bytes it holds right after the last forward pass (counted tensor by tensor, see
``labkit.sharding.memory``) and the collectives it issued in the last step (``labkit.sharding.comm_volume``).
FSDP2 is ``torch.distributed.fsdp.fully_shard`` (Zhao et al. 2023, arXiv:2304.11277);
``reshard_after_forward=False`` keeps the gathered parameters until backward (ZeRO-2-like), ``True`` frees
them after each layer's forward and gathers again in backward (ZeRO-3).
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.models import mlp
from labkit.core.step import StepOptions, TrainStep
from labkit.core.validation import checked_int, positive_int, positive_number
from labkit.memory.device import peak_since
from labkit.memory.model import build_memory_model
from labkit.sharding.comm_volume import (CommCounter, all_gather_single, bytes_written_by_process, counting_collectives,
                                         predicted_bytes_per_step, reduce_scatter_single, simulated_bytes_per_step)
from labkit.sharding.memory import STRATEGIES, check_strategy, count_rank_state_bytes, predict_per_rank
from labkit.training.reference import max_weight_difference, single_process_weights


@dataclass(frozen=True)
class ShardingConfig:
    """The toy workload: widths divisible by every world size tried, so no rank holds padding."""

    in_features: int = 32
    hidden: int = 64
    classes: int = 8
    steps: int = 3
    micro_batch: int = 4
    lr: float = 1e-2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("in_features", "hidden", "classes", "steps", "micro_batch"):
            positive_int(getattr(self, name), name)
        checked_int(self.seed, "seed", minimum=0)
        positive_number(self.lr, "lr")


def build_mlp(cfg: ShardingConfig) -> nn.Sequential:
    """The same float64 MLP on every rank (seeded)."""
    torch.manual_seed(cfg.seed)
    return mlp((cfg.in_features, cfg.hidden, cfg.hidden, cfg.classes)).double()


def global_batch(cfg: ShardingConfig, step: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch (world_size * micro_batch samples), identical in every process."""
    g = torch.Generator().manual_seed(cfg.seed * 1000 + step)
    n = world_size * cfg.micro_batch
    return (torch.randn(n, cfg.in_features, generator=g, dtype=torch.float64),
            torch.randint(0, cfg.classes, (n,), generator=g))


def reference_weights(cfg: ShardingConfig, world_size: int) -> dict[str, torch.Tensor]:
    """The reference: one process, the whole global batch, plain Adam (the reference kit's single-process run)."""
    model = build_mlp(cfg)
    batches = (global_batch(cfg, step, world_size) for step in range(cfg.steps))
    return single_process_weights(model, torch.optim.Adam(model.parameters(), lr=cfg.lr), batches)


class Zero1Optimizer:
    """ZeRO-1 by hand: every rank keeps all parameters and gradients, but Adam state only for its 1/R slice.

    Parameters and gradients live in two flat buffers (padded to a multiple of R). A step reduce-scatters the
    gradients (each rank gets the average of its slice), runs Adam on its slice only, and all-gathers the
    updated slices so every rank has the whole model again (Rajbhandari et al. 2020, Section 5.1).
    """

    def __init__(self, model: nn.Module, lr: float, rank: int, world_size: int) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in params)
        padded = -(-numel // world_size) * world_size
        self.flat = torch.zeros(padded, dtype=params[0].dtype, device=params[0].device)
        self.flat_grad = torch.zeros_like(self.flat)
        offset = 0
        for p in params:                       # parameters and gradients become views into the flat buffers
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.flat[offset:offset + n].view_as(p)
            p.grad = self.flat_grad[offset:offset + n].view_as(p)
            offset += n
        self.params, self.world_size, self.shard_numel = params, world_size, padded // world_size
        lo = rank * self.shard_numel
        self.shard = nn.Parameter(self.flat[lo:lo + self.shard_numel])       # aliases, not copies
        self.shard.grad = self.flat_grad[lo:lo + self.shard_numel]
        self.adam = torch.optim.Adam([self.shard], lr=lr)

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the flat gradient buffer in place (every parameter's .grad is a view into it, so ``set_to_none``,
        taken for the optimizer interface the one step calls, cannot free them)."""
        self.flat_grad.zero_()

    def step(self) -> None:
        """Reduce-scatter the gradients, update this rank's slice, all-gather the parameters."""
        reduced = torch.empty_like(self.shard.grad)      # transient: the output must not alias the input
        reduce_scatter_single(reduced, self.flat_grad, op=dist.ReduceOp.SUM)
        self.shard.grad.copy_(reduced.div_(self.world_size))
        self.adam.step()
        with torch.no_grad():
            all_gather_single(self.flat, self.shard.detach().clone())


def _wrap(cfg: ShardingConfig, strategy: str):
    """(model, optimizer-like) for one strategy, on this rank's device."""
    device = rank_device()
    model = build_mlp(cfg).to(device)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if strategy == "ddp":
        model = DDP(model, gradient_as_bucket_view=True)   # grads are the buckets: no second gradient copy
        model.register_comm_hook(None, CommCounter.ddp_hook)
        return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)
    if strategy == "zero1":
        return model, Zero1Optimizer(model, cfg.lr, rank, world_size)

    mesh = init_device_mesh(device.type, (world_size,))      # explicit: gloo ranks on a GPU box stay on CPU
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=(strategy == "zero3"))
    fully_shard(model, mesh=mesh, reshard_after_forward=(strategy == "zero3"))
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)


def _count(model: nn.Module, opt) -> dict[str, int]:
    if isinstance(opt, Zero1Optimizer):
        return count_rank_state_bytes(model.parameters(), opt.adam, extra_params=[opt.shard])
    return count_rank_state_bytes(model.parameters(), opt)


def strategy_worker(cfg_dict: dict, strategy: str) -> dict:
    """Run inside ``launch``: train with ``strategy``; weights, bytes held after the last forward, comm (nominal and,
    on gloo, on the wire) and, on a GPU, the last step's peak allocated minus what other code held."""
    torch.set_num_threads(1)
    cfg, strategy = ShardingConfig(**cfg_dict), check_strategy(strategy)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    counter = CommCounter(world_size)
    model, opt = _wrap(cfg, strategy)
    device = rank_device()
    held: dict[str, int] = {}
    # grads zeroed in place, not freed: after the forward pass a rank holds the gathered params and last step's grads
    train_step = TrainStep(model, opt, device=device, options=StepOptions(set_to_none=False))

    @contextlib.contextmanager
    def count_after_forward(phase: str) -> Iterator[None]:
        yield
        if phase == "forward":                 # the peak of model state: gathered params + last step's grads
            held.update(_count(model, opt))
    on_sockets, on_gpu = dist.get_backend() == "gloo", device.type == "cuda"
    wire = step_peak = None
    with counting_collectives(counter):
        for step in range(cfg.steps):
            counter.reset()
            written_before = bytes_written_by_process() if on_sockets else None
            if on_gpu:                 # this rank's step peak, without what other code holds on the GPU
                torch.cuda.synchronize(device)
                baseline = torch.cuda.memory_allocated(device) - _count(model, opt)["total"]
                torch.cuda.reset_peak_memory_stats(device)
            x, y = (t.to(device) for t in global_batch(cfg, step, world_size))
            lo = rank * cfg.micro_batch
            train_step(x[lo:lo + cfg.micro_batch], y[lo:lo + cfg.micro_batch], phase=count_after_forward)
            written_after = bytes_written_by_process() if on_sockets else None
            if on_gpu:
                torch.cuda.synchronize(device)
                step_peak = peak_since(device, baseline)[0]
            wire = None if written_before is None or written_after is None else written_after - written_before
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
            for k, v in model.state_dict().items()}
    full = {k.removeprefix("module."): v for k, v in full.items()}
    return {"strategy": strategy, "rank": rank, "world_size": world_size, "weights": full, "held_bytes": held,
            "comm_bytes_sent": counter.bytes_sent(), "comm_calls": counter.by_kind(), "wire_bytes_sent": wire,
            "cuda_step_peak_bytes": step_peak}


def all_strategies_worker(cfg_dict: dict, strategies: tuple[str, ...]) -> list[dict]:
    """Run inside ``launch``: every strategy in turn, in one process group (one start-up for all)."""
    return [strategy_worker(cfg_dict, s) for s in strategies]


def run_strategies(cfg: ShardingConfig, world_size: int, strategies: tuple[str, ...] = STRATEGIES,
                   timeout_s: float = 180.0, backend: str = "auto") -> dict[str, list[dict]]:
    """Launch every strategy on ``world_size`` real processes; {strategy: [rank 0 result, rank 1, ...]}."""
    strategies = tuple(check_strategy(s) for s in strategies)
    per_rank = launch(all_strategies_worker, positive_int(world_size, "world_size"),
                      args=(asdict(cfg), strategies), timeout_s=timeout_s, show_output=False,
                      backend=backend)
    return {s: [rank_results[i] for rank_results in per_rank] for i, s in enumerate(strategies)}


def summarize_runs(cfg: ShardingConfig, runs: dict[int, dict[str, list[dict]]]) -> list[dict]:
    """One row per (world_size, strategy): counted vs predicted bytes per rank, comm three ways (plus the bytes gloo's
    sockets carried), and the answer's gap to one process and to the hand-written ZeRO-1, rank by rank."""
    probe = build_mlp(cfg)
    memory_model = build_memory_model(probe.float(), (cfg.in_features,), optimizer="adam")   # probes are float32
    memory_model = replace(memory_model, param_bytes=memory_model.param_elements * 8)       # the runs are float64
    rows = []
    for world_size, by_strategy in sorted(runs.items()):
        reference = reference_weights(cfg, world_size)
        zero1 = by_strategy.get("zero1")       # the hand-written shard: FSDP2 is checked against it directly
        for strategy, ranks in by_strategy.items():
            predicted = predict_per_rank(memory_model, cfg.micro_batch, strategy, world_size)
            held = [r["held_bytes"] for r in ranks]
            rows.append({"world_size": world_size, "strategy": strategy,
                         "counted_params_bytes": max(h["params"] for h in held),
                         "counted_grads_bytes": max(h["grads"] for h in held),
                         "counted_optimizer_bytes": max(h["optimizer"] for h in held),
                         "counted_total_bytes": max(h["total"] for h in held),
                         "predicted_total_bytes": predicted.total_bytes - predicted.activations_bytes,
                         "counted_comm_bytes": max(r["comm_bytes_sent"] for r in ranks),
                         "wire_comm_bytes": max((r.get("wire_bytes_sent") for r in ranks), key=lambda b: b or 0),
                         "cuda_step_peak_bytes": max((r.get("cuda_step_peak_bytes") for r in ranks),
                                                     key=lambda b: b or 0),
                         "predicted_comm_bytes": predicted_bytes_per_step(strategy, memory_model.param_bytes,
                                                                          world_size),
                         "simulated_comm_bytes": simulated_bytes_per_step(strategy, memory_model.param_bytes,
                                                                          world_size),
                         "max_weight_diff": max(max_weight_difference(r["weights"], reference) for r in ranks),
                         "weight_diff_vs_zero1": None if zero1 is None else max(
                             max_weight_difference(r["weights"], z["weights"]) for r, z in zip(ranks, zero1))})
    return rows


def adam_step_tensor_slack_bytes(cfg: ShardingConfig) -> int:
    """Bytes the prediction leaves out: Adam keeps one scalar 'step' tensor per parameter tensor (8 B at most)."""
    return 8 * len(list(build_mlp(cfg).parameters()))
