"""Tensor and sequence parallelism on real ranks: each rank runs the unsplit layer and its own split of it, and
reports how far apart they are, what it holds, which collectives it issued and what its sockets carried.

Run inside :func:`labkit.comm.launch.launch` (:func:`run_tensor_parallel` does that): gloo CPU processes here,
NCCL where every rank has a GPU. One forward + backward of one layer goes through the kit's one training step
(``TrainStep`` without an optimizer); its phase hook reads the collective counter and ``/proc/self/io`` around the
forward and the backward.
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
from labkit.parallel.tensor.megatron import LayerShape, ParallelBlock, build_block, shard_state
from labkit.parallel.tensor.cost import SavedBytes
from labkit.parallel.tensor.dtensor import comm_counts, device_mesh, dtensor_block, local_params, replicated_local_grads
from labkit.sharding.comm_volume import CommCounter, bytes_written_by_process, counting_collectives

PHASES = ("forward", "backward")


def probe_loss(out: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient is a fixed random tensor: every output element gets its own weight in the check."""
    return (out * probe).sum()


def layer_inputs(shape: LayerShape, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, probe), both (batch, seq_len, d_model): the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    size = (shape.batch, shape.seq_len, shape.d_model)
    return torch.randn(size, generator=gen), torch.randn(size, generator=gen)


def one_step(model: nn.Module, x: torch.Tensor, probe: torch.Tensor,
             extra_grad_sync: list[nn.Parameter] | None = None) -> dict:
    """Forward + backward through the one step; output, input gradient, parameter gradients, and per phase the
    collectives counted and the bytes this process wrote (its sockets, on gloo)."""
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    on_sockets = not dist.is_initialized() or dist.get_backend() == "gloo"    # NCCL's bytes skip the process
    counter, phases, grads, out = CommCounter(world_size), {}, {}, {}
    x = x.clone().requires_grad_()

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        counter.reset()
        before = bytes_written_by_process() if on_sockets else None
        yield
        after = bytes_written_by_process() if on_sockets else None
        phases[name] = {"calls": counter.by_kind(), "nominal_bytes": counter.bytes_sent(),
                        "wire_bytes": None if before is None or after is None else after - before}

    def keep(module: nn.Module) -> None:
        for p in extra_grad_sync or ():            # sequence parallelism: sum the norms' partial gradients
            dist.all_reduce(p.grad)
        grads.update(replicated_local_grads(module))

    def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out["y"] = y.detach().clone()
        return probe_loss(y, target)

    with counting_collectives(counter):
        TrainStep(model, None, loss_fn=loss_fn, device=x.device, grad_hook=keep)(x, probe, phase=phase)
    return {"out": out["y"], "x_grad": x.grad.detach().clone(), "grads": grads,
            "phases": {k: phases[k] for k in PHASES}}


def saved_bytes(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """Bytes one forward keeps for backward on this rank: the norm region and the split blocks."""
    recorder = SavedBytes(model, [model.ln1, model.ln2])
    with recorder.recording():
        model(x.clone().requires_grad_())
    return recorder.totals()


def _max_diff(got: dict[str, torch.Tensor] | torch.Tensor, want: dict[str, torch.Tensor] | torch.Tensor) -> float:
    """Largest |got - want| over every tensor, relative to the largest |want| (a key's bias has a zero gradient:
    softmax ignores it, so each tensor is not measured against its own scale)."""
    if isinstance(got, torch.Tensor):
        got, want = {"t": got}, {"t": want}
    scale = max(float(w.abs().max()) for w in want.values())
    return max(float((got[k] - w).abs().max()) for k, w in want.items()) / max(scale, 1e-30)


def _compare(run: dict, ref: dict, rank: int, world_size: int, seq_sharded: bool) -> dict:
    """How far this rank's output and gradients are from its part of the unsplit layer's."""
    cut = (lambda t: t.chunk(world_size, dim=1)[rank]) if seq_sharded else (lambda t: t)
    return {"out_diff": _max_diff(run["out"], cut(ref["out"])), "x_grad_diff": _max_diff(run["x_grad"], cut(ref["x_grad"])),
            "grad_diff": _max_diff(run["grads"], shard_state(ref["grads"], rank, world_size))}


def tensor_parallel_worker(shape_dict: dict, seed: int = 0) -> dict:
    """Run inside ``launch``: the unsplit layer, Megatron's split by hand (TP, TP + SP) and torch's DTensor API."""
    torch.set_num_threads(1)
    shape, rank, t = LayerShape(**shape_dict), dist.get_rank(), dist.get_world_size()
    shape.check_split(t)
    device = rank_device()
    block = build_block(shape, seed).to(device)
    x, probe = (v.to(device) for v in layer_inputs(shape, seed + 1))
    ref = one_step(block, x, probe)
    result = {"rank": rank, "world_size": t, "backend": dist.get_backend(),
              "unsplit_params": sum(p.numel() for p in block.parameters()),
              "unsplit_saved": saved_bytes(block, x)}
    for name, sp in (("tp", False), ("sp", True)):
        split = ParallelBlock(block, rank, t, sequence_parallel=sp).to(device)
        xs, ps = (v.chunk(t, dim=1)[rank].contiguous() if sp else v for v in (x, probe))
        run = one_step(split, xs, ps, split.replicated_parameters() if sp else None)
        result[name] = {**_compare(run, ref, rank, t, sp), "phases": run["phases"],
                        "params": sum(p.numel() for p in split.parameters()), "saved": saved_bytes(split, xs),
                        "out": run["out"]}
    mesh = device_mesh(t, device.type)
    for name, sp in (("dtensor_tp", False), ("dtensor_sp", True)):
        model = dtensor_block(block, mesh, sequence_parallel=sp)
        xs, ps = (v.chunk(t, dim=1)[rank].contiguous() if sp else v for v in (x, probe))
        forward = comm_counts(lambda: model(xs))
        total: dict = {}
        run = one_step(model, xs, ps)
        total = comm_counts(lambda: one_step(model, xs, ps))
        result[name] = {**_compare(run, ref, rank, t, sp), "phases": run["phases"], "params": local_params(model),
                        "comm_forward": forward, "comm_backward": {k: n - forward.get(k, 0) for k, n in total.items()},
                        "out_vs_hand": _max_diff(run["out"], result["sp" if sp else "tp"]["out"])}
    result["unsplit_out"] = ref["out"]
    return result


def run_tensor_parallel(shape: LayerShape, world_size: int, timeout_s: float = 120.0,
                        backend: str = "auto") -> list[dict]:
    """Launch the worker on ``world_size`` real processes; one result per rank, in rank order."""
    shape.check_split(world_size)
    return launch(tensor_parallel_worker, world_size, args=(asdict(shape),), timeout_s=timeout_s,
                  show_output=False, backend=backend)
