"""Multi-GPU pitfalls in what one rank does differently (PyTorch side), each run broken and then fixed.

4. Saving a wrapped model: the ``module.`` prefix; save the inner model, load with ``weights_only=True``.
5. CUDA_VISIBLE_DEVICES works only if set before CUDA starts: count the GPUs in a fresh process.
6. Rank 0 doing extra work while the others wait in a collective: a real timeout, then two fixes.

Pitfalls 1-3 and 7 (the data each rank sees) are in ``labkit.parallel.debug.data_pitfalls``.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from labkit.comm.backend import choose_backend
from labkit.comm.launch import RankFailedError, launch
from labkit.comm.worker import rank_device
from labkit.core.clock import Deadline, now_s
from labkit.core.procs import run_in_fresh_process
from labkit.core.validation import checked_int, positive_number


# ---------------------------------------------------------------------------------------------- pitfall 4
@dataclass(frozen=True)
class WrappedSaveEvidence:
    """Pitfall 4's evidence: the wrapper's 'module.' keys failing to load, the inner model's loading exactly."""

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


# ---------------------------------------------------------------------------------------------- pitfall 5
def count_visible_gpus() -> dict:
    """Run in a fresh process: how many GPUs torch counts there, and whether counting started CUDA."""
    return {"gpus": torch.cuda.device_count(), "cuda_initialized": torch.cuda.is_initialized()}


def torch_visible_gpus(cuda_visible_devices: str | None, timeout_s: float = 120.0) -> dict:
    """Pitfall 5: in a fresh process with this CUDA_VISIBLE_DEVICES, how many GPUs torch counts (and whether
    counting initialised CUDA). The variable only works if set before CUDA starts, hence a new process;
    ``None`` leaves the variable as this process has it."""
    env = None if cuda_visible_devices is None else {"CUDA_VISIBLE_DEVICES": cuda_visible_devices}
    out = run_in_fresh_process("labkit.parallel.debug.rank_pitfalls:count_visible_gpus", env=env, timeout_s=timeout_s)
    return {"CUDA_VISIBLE_DEVICES": cuda_visible_devices, "gpus": out["gpus"],
            "cuda_initialized": out["cuda_initialized"]}


# ---------------------------------------------------------------------------------------------- pitfall 6
TIMEOUT_WORDS = ("timed out", "timeout", "timing out")   # gloo: "Timed out waiting"; NCCL: "Watchdog ... timeout"
# NCCL's watchdog otherwise aborts the process; blocking wait raises the timeout in the rank that waited instead
NCCL_TIMEOUT_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1"}


def _busy_work(seconds: float) -> int:
    """Real CPU work (matmuls standing for evaluation/checkpointing) for at least ``seconds``."""
    a, n, deadline = torch.randn(256, 256), 0, Deadline(seconds)
    while not deadline.expired:
        a = torch.tanh(a @ a)
        n += 1
    return n


def rank0_extra_work_worker(extra_work_s: float, variant: str, barrier_timeout_s: float) -> dict:
    """One rank of pitfall 6: rank 0 evaluates, then every rank all-reduces (variant picks broken or a fix)."""
    rank, start = dist.get_rank(), now_s()
    # a group with its own, deliberately long timeout, for the one place where waiting is expected
    patient = (dist.new_group(backend="gloo", timeout=timedelta(seconds=barrier_timeout_s))
               if variant == "barrier" else None)
    if variant == "all_ranks":
        _busy_work(extra_work_s)                        # every rank evaluates its shard: equal work
    elif rank == 0:
        _busy_work(extra_work_s)                        # evaluation/checkpoint on rank 0 only
    if variant == "barrier":                            # a barrier whose timeout covers the known extra work
        dist.barrier(group=patient)
    grad = torch.ones(4, device=rank_device()) * (rank + 1)
    dist.all_reduce(grad)                               # the next step's gradient all-reduce
    return {"rank": rank, "sum": grad.tolist(), "elapsed_s": now_s() - start}


@dataclass(frozen=True)
class StragglerEvidence:
    """Pitfall 6's evidence for one variant: did the collective survive rank 0's extra work, and how long it took."""

    variant: str
    ok: bool
    failed_rank: int | None
    error: str | None
    wall_s: float
    all_reduce_result: list | None
    backend: str = "gloo"               # the backend the ranks ran on ...
    backend_reason: str = ""            # ... and why (labkit.comm.backend.choose_backend)

    @property
    def timed_out(self) -> bool:
        """Whether the failure was the collective's timeout, in gloo's words ("Timed out") or NCCL's ("timeout")."""
        return bool(self.error) and any(w in self.error.lower() for w in TIMEOUT_WORDS)


def rank0_extra_work(variant: str = "broken", *, extra_work_s: float = 4.0, pg_timeout_s: float = 2.0,
                     barrier_timeout_s: float = 30.0, world_size: int = 2,
                     timeout_s: float = 120.0) -> StragglerEvidence:
    """Pitfall 6 with real processes and a short collective timeout (``pg_timeout_s`` < ``extra_work_s``).

    The kit's backend rule picks the backend: NCCL when every rank has a GPU of its own (with blocking wait, so
    the timeout is raised in the rank that waited, as gloo does), else gloo CPU processes; the evidence says which.
    """
    if variant not in ("broken", "all_ranks", "barrier"):
        raise ValueError(f"variant must be 'broken', 'all_ranks' or 'barrier', got {variant!r}")
    for name, seconds in (("extra_work_s", extra_work_s), ("pg_timeout_s", pg_timeout_s),
                          ("barrier_timeout_s", barrier_timeout_s)):
        positive_number(seconds, name, hint="a number of seconds")
    checked_int(world_size, "world_size", minimum=2, hint="rank 0's extra work needs another rank waiting for it")
    choice, start = choose_backend(world_size), now_s()
    try:
        res = launch(rank0_extra_work_worker, world_size, args=(extra_work_s, variant, barrier_timeout_s),
                     backend=choice.backend, timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, show_output=False,
                     env=NCCL_TIMEOUT_ENV if choice.uses_gpus else None)
    except RankFailedError as err:
        return StragglerEvidence(variant, False, err.rank, _failure_text(err), now_s() - start, None,
                                 choice.backend, choice.reason)
    return StragglerEvidence(variant, True, None, None, now_s() - start, res[0]["sum"], choice.backend, choice.reason)


def _failure_text(err: RankFailedError) -> str:
    """The failure's summary, plus the traceback line that names a timeout when the summary does not."""
    if any(w in err.summary.lower() for w in TIMEOUT_WORDS):
        return err.summary
    lines = [ln.strip() for ln in err.remote_traceback.splitlines() if any(w in ln.lower() for w in TIMEOUT_WORDS)]
    return f"{err.summary}: {lines[-1][:300]}" if lines else err.summary
