"""Expert parallelism on real ranks: each rank runs the one-process MoE on every rank's tokens and its own part of
the expert-parallel MoE on its tokens, and reports how far apart they are, what it dropped, the split sizes it
sent and what its sockets carried.

Run inside :func:`labkit.comm.launch.launch` (:func:`run_expert_parallel` does that): gloo CPU processes here, NCCL
where every rank has a GPU. One forward + backward goes through the kit's one training step (``TrainStep`` without
an optimizer), with a loss whose gradient is a fixed random tensor, so every output element is checked.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.step import TrainStep
from labkit.parallel.experts.dispatch import ExpertParallelMoE
from labkit.parallel.experts.moe import MoE, MoEConfig, predicted_dropped
from labkit.sharding.comm_volume import bytes_written_by_process

PHASES = ("forward", "backward")


def group_inputs(config: MoEConfig, ep: int, tokens: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, probe), both (ep, tokens, hidden): row r is rank r's tokens, the same tensors on every rank."""
    gen = torch.Generator().manual_seed(seed)
    size = (ep, tokens, config.hidden)
    return torch.randn(size, generator=gen), torch.randn(size, generator=gen)


def one_step(model: nn.Module, x: torch.Tensor, probe: torch.Tensor, sync_router: bool = False) -> dict:
    """Forward + backward through the one step: output, input gradient, parameter gradients (the router's summed
    over the ranks when ``sync_router``), and per phase the bytes this process wrote (its sockets, on gloo)."""
    phases, out, grads, unsynced = {}, {}, {}, {}
    x = x.clone().requires_grad_()

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        before = bytes_written_by_process()
        yield
        after = bytes_written_by_process()
        phases[name] = None if before is None or after is None else after - before

    def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out["y"] = y.detach().clone()
        return (y * target).sum()

    def keep(module: nn.Module) -> None:
        if sync_router:
            unsynced.update({n: p.grad.detach().clone() for n, p in module.router.named_parameters()})
            module.sync_router_grads()
        grads.update({n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None})

    TrainStep(model, None, loss_fn=loss_fn, device=x.device, grad_hook=keep)(x, probe, phase=phase)
    return {"out": out["y"], "x_grad": x.grad.detach().clone(), "grads": grads,
            "wire_bytes": {k: phases.get(k) for k in PHASES},
            "unsynced_router_grads": {f"router.{n}": g for n, g in unsynced.items()}}


def local_names(name: str, first: int) -> str:
    """A parameter of the rank's part as the one-process MoE names it: experts.0 on rank 1 of 4 (8 experts) is
    experts.2."""
    if not name.startswith("experts."):
        return name
    _, index, rest = name.split(".", 2)
    return f"experts.{int(index) + first}.{rest}"


def _max_abs(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) if got.numel() else 0.0


def is_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """``torch.testing.assert_close`` with its float32 defaults (rtol 1.3e-6, atol 1e-5: a few ulps of rounding from
    sums taken in another order), as a yes or no."""
    try:
        torch.testing.assert_close(got, want)
    except AssertionError:
        return False
    return True


def expert_parallel_worker(config_dict: dict, tokens: int, seed: int = 0) -> dict:
    """Run inside ``launch``: the one-process MoE on all ranks' tokens, then this rank's expert-parallel part."""
    torch.set_num_threads(1)
    config, rank, ep, device = MoEConfig(**config_dict), dist.get_rank(), dist.get_world_size(), rank_device()
    x, probe = (v.to(device) for v in group_inputs(config, ep, tokens, seed + 1))
    reference = MoE(config, seed).to(device)
    ref = one_step(reference, x, probe)
    part = ExpertParallelMoE(reference, rank, ep).to(device)
    run = one_step(part, x[rank], probe[rank], sync_router=True)
    want_grads = {n: ref["grads"][local_names(n, part.first)] for n in run["grads"]}
    gaps = {"out": _max_abs(run["out"], ref["out"][rank]), "x_grad": _max_abs(run["x_grad"], ref["x_grad"][rank]),
            **{n: _max_abs(g, want_grads[n]) for n, g in run["grads"].items()}}
    scale = {"out": float(ref["out"].abs().max()), "x_grad": float(ref["x_grad"].abs().max()),
             **{n: float(w.abs().max()) for n, w in want_grads.items()}}
    pairs = {"out": (run["out"], ref["out"][rank]), "x_grad": (run["x_grad"], ref["x_grad"][rank]),
             **{n: (g, want_grads[n]) for n, g in run["grads"].items()}}
    routing = part.routing
    return {"rank": rank, "ep": ep, "first": part.first, "tokens": tokens, "gaps": gaps, "scales": scale,
            "close": {n: is_close(*pair) for n, pair in pairs.items()},
            "unsynced_router_close": {n: is_close(g, want_grads[n]) for n, g in run["unsynced_router_grads"].items()},
            "grads_compared": sorted(run["grads"]), "send": part.last["send"], "recv": part.last["recv"],
            "routed": routing.routed.tolist(), "kept": routing.kept.tolist(), "dropped": routing.dropped,
            "capacity": config.capacity(tokens), "predicted_dropped": predicted_dropped(routing.routed,
                                                                                     config.capacity(tokens)),
            "received_per_expert": part.last["received_per_expert"],
            "reference_dropped": reference.routings[rank].dropped, "wire_bytes": run["wire_bytes"],
            "backend": dist.get_backend()}


def run_expert_parallel(config: MoEConfig, ep: int, tokens: int, timeout_s: float = 120.0,
                        backend: str = "auto") -> list[dict]:
    """Launch the worker on ``ep`` real processes; one result per rank, in rank order."""
    config.experts_per_rank(ep)
    return launch(expert_parallel_worker, ep, args=(asdict(config), tokens), timeout_s=timeout_s,
                  show_output=False, backend=backend)
