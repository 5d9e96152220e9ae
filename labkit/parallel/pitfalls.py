"""Multi-GPU pitfalls on the PyTorch side, each run broken and then fixed, returning evidence to assert on.

1. Uneven last batch: DistributedSampler pads ranks to equal length (duplicating samples); a last
   batch of one sample makes BatchNorm1d raise (PyTorch skips an *empty* batch); ``drop_last`` fixes it.
2. Per-replica batches that are too small: samples/s measured by batch size.
3. DistributedSampler padding double-counts samples in a distributed evaluation (real processes).
4. Saving a wrapped model: the ``module.`` prefix; save the inner model, load with ``weights_only=True``.
6. Rank 0 doing extra work while the others wait in a collective: a real timeout, then two fixes.
7. Each rank needs its own shard; learning-rate scaling with the number of workers (Goyal et al. 2017,
   "Accurate, Large Minibatch SGD", arXiv:1706.02677) — a starting point that is then tuned.
"""
from __future__ import annotations

import io
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from labkit.comm.backend import check_data_size
from labkit.core.timing import time_fn


# ---------------------------------------------------------------------------------------------- pitfall 1
@dataclass(frozen=True)
class TorchUnevenBatchEvidence:
    samples_per_rank: tuple[int, ...]          # DistributedSampler(drop_last=False): padded to equal length
    duplicated_samples: int                    # samples that appear twice across ranks because of the padding
    last_batch_sizes: tuple[int, ...]          # per rank, DataLoader(drop_last=False)
    broken_error: str | None                   # BatchNorm1d on the 1-sample last batch
    fixed_last_batch_sizes: tuple[int, ...]    # DataLoader(drop_last=True)
    fixed_stats_finite: bool
    empty_batch_changes_stats: bool            # does BatchNorm update its statistics on a 0-sample batch?


def _train_bn_over(batches: list[torch.Tensor]) -> tuple[nn.BatchNorm1d, str | None]:
    bn = nn.BatchNorm1d(4).train()
    try:
        for xb in batches:
            bn(xb)
    except ValueError as err:
        return bn, str(err)
    return bn, None


def torch_uneven_last_batch(num_examples: int = 65, batch_size: int = 8, world_size: int = 2) -> TorchUnevenBatchEvidence:
    """Pitfall 1, PyTorch side: the real DistributedSampler and BatchNorm1d, ranks simulated by ``rank=``."""
    check_data_size(world_size, num_examples)
    data = torch.randn(num_examples, 4, generator=torch.Generator().manual_seed(0))
    shards = [list(DistributedSampler(range(num_examples), world_size, r, shuffle=False)) for r in range(world_size)]
    counts = np.bincount(np.concatenate(shards), minlength=num_examples)
    last, errors, fixed_last, finite = [], [], [], True
    for idx in shards:
        batches = [data[idx[i:i + batch_size]] for i in range(0, len(idx), batch_size)]
        last.append(len(batches[-1]))
        errors.append(_train_bn_over(batches)[1])
        full = [b for b in batches if len(b) == batch_size]                 # what drop_last=True yields
        fixed_last.append(len(full[-1]))
        bn, _ = _train_bn_over(full)
        finite &= bool(torch.isfinite(bn.running_mean).all() and torch.isfinite(bn.running_var).all())
    bn, _ = _train_bn_over([data[:batch_size]])
    before = bn.running_mean.clone()
    bn(data[:0])                                                           # a 0-sample batch
    return TorchUnevenBatchEvidence(tuple(map(len, shards)), int((counts > 1).sum()), tuple(last),
                                    next((e for e in errors if e), None), tuple(fixed_last), finite,
                                    not torch.equal(before, bn.running_mean))


# ---------------------------------------------------------------------------------------------- pitfall 2
def samples_per_s_by_batch(model: nn.Module, batch_sizes: tuple[int, ...] = (2, 8, 32), *,
                           image_shape: tuple[int, int, int] = (3, 32, 32), repeats: int = 5,
                           cpu_threads: int | None = 1) -> dict[int, float]:
    """Training-step throughput (samples/s, median) for each per-replica batch size on this device.

    On a CPU it uses ``cpu_threads`` torch threads (default 1, restored afterwards): multi-threaded ops on a
    shared, busy machine stall waiting for descheduled threads, which would drown the batch-size effect.
    """
    device = next(model.parameters()).device
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = torch.get_num_threads()
    if cpu_threads is not None and device.type == "cpu":
        torch.set_num_threads(cpu_threads)
    try:
        return _throughputs(model, opt, batch_sizes, image_shape, repeats, device)
    finally:
        torch.set_num_threads(before)


def _throughputs(model, opt, batch_sizes, image_shape, repeats, device) -> dict[int, float]:
    out = {}
    for bs in batch_sizes:
        x = torch.randn(bs, *image_shape, device=device)
        y = torch.randint(0, 10, (bs,), device=device)

        def step():
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        out[bs] = bs / time_fn(step, warmup=2, repeats=repeats, device=device).median_s
    return out


# ---------------------------------------------------------------------------------------------- pitfall 3
def _rank_device() -> torch.device:
    """This rank's device under the one backend rule: its own GPU with NCCL, else the CPU (gloo)."""
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _shard_totals(correct: list[int], indices: list[int]) -> dict:
    import torch.distributed as dist

    totals = torch.tensor([sum(correct[i] for i in indices), len(indices)], dtype=torch.float64,
                          device=_rank_device())
    dist.all_reduce(totals)                                    # sum (correct, seen) over all ranks
    return {"indices": indices, "correct": float(totals[0]), "seen": float(totals[1])}


def sharded_eval_worker(correct: list[int]) -> dict:
    """One rank: accuracy counts on DistributedSampler's padded shard, then on an unpadded shard."""
    import torch.distributed as dist

    rank, world, n = dist.get_rank(), dist.get_world_size(), len(correct)
    padded = list(DistributedSampler(range(n), world, rank, shuffle=False))
    return {"padded": _shard_totals(correct, padded),
            "unpadded": _shard_totals(correct, list(range(rank, n, world)))}   # the fix: uneven shards


@dataclass(frozen=True)
class ShardedEvalEvidence:
    exact_accuracy: float
    padded_accuracy: float
    padded_samples_seen: int
    fixed_accuracy: float
    fixed_samples_seen: int


def padded_eval_accuracy(correct: list[int], world_size: int = 3, timeout_s: float = 120.0) -> ShardedEvalEvidence:
    """Pitfall 3: distributed accuracy with DistributedSampler's padding vs unpadded shards (real processes)."""
    from labkit.comm.launch import launch

    if not correct or any(c not in (0, 1) for c in correct):
        raise ValueError("correct must be a non-empty list of 0/1 flags (1 = prediction was right)")
    check_data_size(world_size, len(correct), "the evaluation set")
    res = launch(sharded_eval_worker, world_size, args=(list(map(int, correct)),), timeout_s=timeout_s,
                 show_output=False)[0]
    pad, fix = res["padded"], res["unpadded"]
    return ShardedEvalEvidence(float(np.mean(correct)), pad["correct"] / pad["seen"], int(pad["seen"]),
                               fix["correct"] / fix["seen"], int(fix["seen"]))


# ---------------------------------------------------------------------------------------------- pitfall 4
@dataclass(frozen=True)
class WrappedSaveEvidence:
    wrapped_keys_sample: tuple[str, ...]
    broken_error: str                    # loading the wrapper's state_dict into a plain model
    fixed_max_abs_diff: float            # plain model loaded from the inner model's state_dict
    pickled_model_error: str             # torch.load(weights_only=True) refusing a whole pickled module


def save_wrapped_model(model: nn.Module, sample: torch.Tensor, fresh: nn.Module) -> WrappedSaveEvidence:
    """Pitfall 4: save a DataParallel-wrapped model's state_dict (broken) and its ``.module``'s (fixed)."""
    wrapped = nn.DataParallel(model)                                  # DDP adds the same 'module.' prefix
    device = next(model.parameters()).device                          # DataParallel moves it to cuda:0 on a GPU box
    fresh, sample = fresh.to(device), sample.to(device)
    buf = io.BytesIO()
    torch.save(wrapped.state_dict(), buf)
    buf.seek(0)
    try:
        fresh.load_state_dict(torch.load(buf, weights_only=True))
        broken = "loaded without error"
    except RuntimeError as err:
        broken = str(err).splitlines()[0] + " " + " ".join(str(err).split()[1:12])
    buf = io.BytesIO()
    torch.save(wrapped.module.state_dict(), buf)                       # the fix: save the inner model
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    model.eval(), fresh.eval()
    with torch.no_grad():
        diff = float((model(sample) - fresh(sample)).abs().max())
    buf = io.BytesIO()
    torch.save(model, buf)                                            # pickles code, not just tensors
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
        pickled = "loaded without error"
    except Exception as err:  # noqa: BLE001 - torch raises UnpicklingError here
        pickled = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    keys = tuple(list(wrapped.state_dict())[:3])
    return WrappedSaveEvidence(keys, broken, diff, pickled)


# ---------------------------------------------------------------------------------------------- pitfall 6
def _busy_work(seconds: float) -> int:
    """Real CPU work (matmuls standing for evaluation/checkpointing) for at least ``seconds``."""
    a, n, end = torch.randn(256, 256), 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
        n += 1
    return n


def rank0_extra_work_worker(extra_work_s: float, variant: str, barrier_timeout_s: float) -> dict:
    """One rank of pitfall 6: rank 0 evaluates, then every rank all-reduces (variant picks broken or a fix)."""
    import torch.distributed as dist

    rank, start = dist.get_rank(), time.perf_counter()
    # a group with its own, deliberately long timeout, for the one place where waiting is expected
    patient = dist.new_group(backend="gloo", timeout=timedelta(seconds=barrier_timeout_s)) if variant == "barrier" else None
    if variant == "all_ranks":
        _busy_work(extra_work_s)                        # every rank evaluates its shard: equal work
    elif rank == 0:
        _busy_work(extra_work_s)                        # evaluation/checkpoint on rank 0 only
    if variant == "barrier":                            # a barrier whose timeout covers the known extra work
        dist.barrier(group=patient)
    grad = torch.ones(4, device=_rank_device()) * (rank + 1)
    dist.all_reduce(grad)                               # the next step's gradient all-reduce
    return {"rank": rank, "sum": grad.tolist(), "elapsed_s": time.perf_counter() - start}


@dataclass(frozen=True)
class StragglerEvidence:
    variant: str
    ok: bool
    failed_rank: int | None
    error: str | None
    wall_s: float
    all_reduce_result: list | None


def rank0_extra_work(variant: str = "broken", *, extra_work_s: float = 4.0, pg_timeout_s: float = 2.0,
                     barrier_timeout_s: float = 30.0, world_size: int = 2, timeout_s: float = 120.0) -> StragglerEvidence:
    """Pitfall 6 with real processes and a short collective timeout (``pg_timeout_s`` < ``extra_work_s``)."""
    from labkit.comm.launch import RankFailedError, launch

    if variant not in ("broken", "all_ranks", "barrier"):
        raise ValueError(f"variant must be 'broken', 'all_ranks' or 'barrier', got {variant!r}")
    start = time.perf_counter()
    try:
        res = launch(rank0_extra_work_worker, world_size, args=(extra_work_s, variant, barrier_timeout_s),
                     timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, show_output=False)
    except RankFailedError as err:
        return StragglerEvidence(variant, False, err.rank, err.summary, time.perf_counter() - start, None)
    return StragglerEvidence(variant, True, None, None, time.perf_counter() - start, res[0]["sum"])


# ---------------------------------------------------------------------------------------------- pitfall 7
def shard_coverage(num_examples: int, world_size: int, use_sampler: bool) -> dict[str, int]:
    """Samples read per epoch by all ranks together, and how many of them are distinct."""
    if use_sampler:
        reads = [list(DistributedSampler(range(num_examples), world_size, r, shuffle=True, seed=0))
                 for r in range(world_size)]
    else:                                               # every rank iterates the whole dataset
        reads = [list(range(num_examples)) for _ in range(world_size)]
    flat = np.concatenate(reads)
    return {"samples_read": int(len(flat)), "distinct": int(len(np.unique(flat))), "per_rank": len(reads[0])}


def lr_scaling_run(x: torch.Tensor, y: torch.Tensor, xv: torch.Tensor, yv: torch.Tensor, *, global_batch: int,
                   lr: float, epochs: int = 3, seed: int = 0) -> float:
    """Train an MLP with plain SGD at ``global_batch`` and ``lr`` for ``epochs``; validation accuracy.

    One process with batch k*B computes the same averaged gradient as k synchronous workers with B each.
    """
    from labkit.core.models import MLP

    torch.manual_seed(seed)
    model = MLP(int(max(y.max(), yv.max())) + 1, in_features=x[0].numel(), hidden=128)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x) - global_batch + 1, global_batch):
            idx = perm[i:i + global_batch]
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            if not torch.isfinite(loss):
                return float("nan")
            loss.backward()
            opt.step()
    with torch.no_grad():
        return float((model(xv).argmax(1) == yv).float().mean())


# ---------------------------------------------------------------------------------------------- helpers
def dataset_arrays(dataset) -> tuple[np.ndarray, np.ndarray]:
    """All of a map-style dataset as numpy arrays (x, y), in order."""
    from torch.utils.data import DataLoader

    x, y = next(iter(DataLoader(dataset, batch_size=len(dataset), shuffle=False)))
    return x.numpy(), y.numpy()


def torch_visible_gpus(cuda_visible_devices: str | None, timeout_s: float = 120.0) -> dict:
    """Pitfall 5: in a fresh process with this CUDA_VISIBLE_DEVICES, how many GPUs torch counts (and whether
    counting initialised CUDA). The variable only works if set before CUDA starts, hence a new process."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    code = ("import json, torch; n = torch.cuda.device_count(); "
            "print(json.dumps({'gpus': n, 'cuda_initialized': torch.cuda.is_initialized()}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode:
        raise RuntimeError(f"device-count child failed: {proc.stderr.strip().splitlines()[-1:]}")
    return {"CUDA_VISIBLE_DEVICES": cuda_visible_devices, **json.loads(proc.stdout.strip().splitlines()[-1])}
