"""torch's own overlap knobs on real ranks: DDP's ``bucket_cap_mb`` and ``register_comm_hook``, FSDP2's explicit
prefetch (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``) and ``reshard_after_forward``.

DDP: the comm hook sees each bucket as DDP launches it; the bucket count per step follows ``bucket_cap_mb`` and the
gradients equal the hand-written sync's (:mod:`labkit.parallel.overlap.grad_sync`). FSDP2 (Zhao et al. 2023,
arXiv:2304.11277): each linear is its own FSDP unit. At each layer's forward start the rank counts the all-gathers
issued so far: with forward prefetch the next layer's is already out (one ahead). After forward it counts the bytes
of unsharded parameters it still holds (``reshard_after_forward=False`` keeps every layer's, for backward to reuse;
True frees them and gathers again). Step times come from interleaved rounds with the ranks' CPU shares.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from labkit.comm.launch import launch
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.step import TrainStep
from labkit.parallel.overlap.grad_sync import GradSync, assign_buckets
from labkit.parallel.overlap.runs import OverlapConfig, build_mlp, rank_batch
from labkit.sharding.comm_volume import CommCounter, counting_collectives

FSDP_VARIANTS = {"default": (True, False), "prefetch": (True, True), "keep_unsharded": (False, False)}
# name -> (reshard_after_forward, explicit forward + backward prefetch)


def counting_hook(state: list, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook: note this bucket's bytes in ``state`` (a list), then DDP's default averaging all-reduce."""
    state.append(bucket.buffer().numel() * bucket.buffer().element_size())
    return allreduce_hook(None, bucket)


# DDP's register_comm_hook checks the hook's annotations against the real classes: give it the objects.
counting_hook.__annotations__.update(state=object, bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]})


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sync: GradSync | None = None) -> dict:
    out: dict[str, torch.Tensor] = {}

    def keep(m: nn.Module) -> None:
        if sync is not None:
            sync.finish()
        out.update({n.removeprefix("module."): p.grad.detach().clone() for n, p in m.named_parameters()})
    TrainStep(model, None, loss_fn=nn.functional.mse_loss, grad_hook=keep)(x, y)
    return out


def ddp_knobs(cfg: OverlapConfig, caps_mb: tuple[float, ...]) -> dict:
    """Per ``bucket_cap_mb``: the buckets DDP's comm hook saw in the second step (after DDP rebuilt its buckets in
    backward's order) and the largest gap to the hand-written bucketed sync's gradients."""
    x, y = rank_batch(cfg, dist.get_rank(), dist.get_world_size())
    out = {}
    for cap_mb in caps_mb:
        model = build_mlp(cfg)
        hand = GradSync(model, "bucketed", cap_mb * 2**20)
        want = _grads(model, x, y, hand)
        hand.remove()
        seen: list[int] = []
        ddp = nn.parallel.DistributedDataParallel(build_mlp(cfg), bucket_cap_mb=cap_mb)
        ddp.register_comm_hook(seen, counting_hook)
        _grads(ddp, x, y)
        seen.clear()
        got = _grads(ddp, x, y)
        gap = max(float((got[k] - w).abs().max()) for k, w in want.items()) / max(
            float(w.abs().max()) for w in want.values())
        out[cap_mb] = {"bucket_bytes": list(seen), "gap": gap}
    return out


def _fsdp_model(cfg: OverlapConfig, reshard: bool, prefetch: bool) -> tuple[nn.Module, list[nn.Module]]:
    model = build_mlp(cfg)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    layers = [m for m in model if isinstance(m, nn.Linear)]
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    if prefetch:
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 2])
            layer.set_modules_to_backward_prefetch(layers[i - 1:i] if i > 0 else [])
    return model, layers


def unsharded_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds whole right now (FSDP2 shows a sharded one as a DTensor)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not isinstance(p, DTensor))


def fsdp_probe(cfg: OverlapConfig, reshard: bool, prefetch: bool) -> dict:
    """One step: all-gathers issued at each layer's forward start and in all, and the unsharded bytes held after
    forward."""
    model, layers = _fsdp_model(cfg, reshard, prefetch)
    x, y = rank_batch(cfg, dist.get_rank(), dist.get_world_size())
    counter, seen, held = CommCounter(dist.get_world_size()), [], {}
    handles = [layer.register_forward_pre_hook(lambda _m, _a: seen.append(counter.by_kind()["all_gather"]))
               for layer in layers]

    def after_forward(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        held["bytes"] = unsharded_bytes(model)
        return nn.functional.mse_loss(out, target)
    with counting_collectives(counter):
        TrainStep(model, None, loss_fn=after_forward)(x, y)
    for h in handles:
        h.remove()
    return {"gathers_at_layer_start": seen, "gathers_per_step": counter.by_kind()["all_gather"],
            "unsharded_after_forward_bytes": held["bytes"],
            "full_param_bytes": cfg.grad_bytes}


def fsdp_times(cfg: OverlapConfig) -> dict:
    """Seconds per step of each FSDP2 variant, interleaved rounds after a barrier, and this rank's CPU share."""
    x, y = rank_batch(cfg, dist.get_rank(), dist.get_world_size())
    steps = {n: TrainStep(_fsdp_model(cfg, *flags)[0], None, loss_fn=nn.functional.mse_loss)
             for n, flags in FSDP_VARIANTS.items()}
    names = list(steps)
    for n in names:
        steps[n](x, y)                                          # warm-up
    out: dict[str, list[float]] = {n: [] for n in names}
    with ShareMeter() as meter:
        for r in range(cfg.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                dist.barrier()
                start = now_s()
                steps[n](x, y)
                out[n].append(now_s() - start)
    return {"step_s": out, "cpu_share": meter.share}


def knobs_worker(cfg_dict: dict, caps_mb: tuple[float, ...] = (0.05, 0.25, 25.0)) -> dict:
    """Run inside ``launch``: DDP's knobs, then FSDP2's probes and timed rounds."""
    torch.set_num_threads(1)
    cfg = OverlapConfig(**cfg_dict)
    probes = {n: fsdp_probe(cfg, *flags) for n, flags in FSDP_VARIANTS.items()}
    return {"rank": dist.get_rank(), "ddp": ddp_knobs(cfg, caps_mb), "fsdp": probes, **fsdp_times(cfg)}


def run_knobs(cfg: OverlapConfig, caps_mb: tuple[float, ...] = (0.5, 2.0, 25.0), world_size: int = 2,
              timeout_s: float = 180.0) -> list[dict]:
    """Launch :func:`knobs_worker` on ``world_size`` ranks; one result per rank."""
    return launch(knobs_worker, world_size, args=(asdict(cfg), tuple(caps_mb)), timeout_s=timeout_s, backend="gloo",
                  show_output=False)


def median_step_s(results: list[dict], variant: str) -> float:
    """Median over rounds of the slowest rank's step for ``variant``."""
    rounds = len(results[0]["step_s"][variant])
    return statistics.median(max(r["step_s"][variant][i] for r in results) for i in range(rounds))


def ddp_rows(results: list[dict], cfg: OverlapConfig) -> list[dict]:
    """Per bucket_cap_mb: buckets DDP's hook saw (rank 0) beside the hand-written assignment's, and the largest
    gradient gap to the hand-written sync over the ranks."""
    sizes = [p.numel() * p.element_size() for p in build_mlp(cfg).parameters()]
    return [{"bucket_cap_mb": cap, "ddp buckets": len(seen["bucket_bytes"]),
             "hand-written buckets": len(assign_buckets(sizes, cap * 2**20)),
             "largest bucket MiB": max(seen["bucket_bytes"]) / 2**20,
             "gradient gap": max(r["ddp"][cap]["gap"] for r in results)}
            for cap, seen in results[0]["ddp"].items()]


def fsdp_rows(results: list[dict]) -> list[dict]:
    """Per FSDP2 variant: its flags, all-gathers at each layer's start and per step, the unsharded bytes held after
    forward (the most any rank held) and the median step."""
    rows = []
    for name, (reshard, prefetch) in FSDP_VARIANTS.items():
        probe = results[0]["fsdp"][name]
        rows.append({"variant": name, "reshard_after_forward": reshard, "explicit prefetch": prefetch,
                     "all-gathers issued at each layer's start": probe["gathers_at_layer_start"],
                     "all-gathers per step": probe["gathers_per_step"],
                     "unsharded after forward MiB": max(r["fsdp"][name]["unsharded_after_forward_bytes"]
                                                        for r in results) / 2**20,
                     "step ms": 1e3 * median_step_s(results, name)})
    return rows
