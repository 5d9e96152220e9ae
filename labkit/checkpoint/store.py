"""Where checkpoints live and which ones to trust: step folders, the "latest complete" picker, a loader that refuses a
save cut short in one line, and a storage writer that fails on purpose (out of disk, or killed mid-write).

DCP writes each rank's shards first and the ``.metadata`` file last, from the coordinator (rank 0), only after every
rank reported its writes done (``torch.distributed.checkpoint``'s two-phase save). A folder without ``.metadata`` is
therefore a save that did not finish: never loaded, whatever shard files it holds. The picker trusts nothing else.
A real full disk (a 1 MiB tmpfs in the tests) does not say ENOSPC: torch.save's zip writer fails with "unexpected
pos"; the one line of :func:`save_error_line` reads the free space and says what happened.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import signal
from concurrent.futures import Future
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.optim import Optimizer

METADATA = ".metadata"
STEP_PREFIX = "step_"
_SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")
PARTIAL_WRITE_BYTES = 4096        # what a failing writer puts on disk before it fails: a half-written shard
FAILURES = ("enospc", "kill")
FULL_DISK_FREE_BYTES = 1 << 20    # less than 1 MiB free after a failed save: the disk is full, whatever torch said


class IncompleteCheckpointError(RuntimeError):
    """A checkpoint folder has no ``.metadata``: its save never finished, and it must not be loaded."""


def step_folder(root: str | Path, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` steps, e.g. ``root/step_000002``."""
    return Path(root) / f"{STEP_PREFIX}{int(step):06d}"


def is_complete(path: str | Path) -> bool:
    """True when the save finished: the coordinator wrote ``.metadata`` after every rank's shards."""
    return (Path(path) / METADATA).is_file()


def step_folders(root: str | Path) -> list[Path]:
    """Every ``step_NNNNNN`` folder under ``root``, oldest step first (complete or not)."""
    found = [p for p in Path(root).glob(f"{STEP_PREFIX}*") if p.is_dir() and p.name[len(STEP_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX):]))


def latest_complete(root: str | Path) -> Path | None:
    """The newest checkpoint whose save finished (has ``.metadata``); None when there is none."""
    complete = [p for p in step_folders(root) if is_complete(p)]
    return complete[-1] if complete else None


def check_complete(path: str | Path) -> Path:
    """``path`` if its save finished, else one IncompleteCheckpointError line naming the newest complete one."""
    path = Path(path)
    if is_complete(path):
        return path
    if not path.is_dir():
        raise IncompleteCheckpointError(f"no checkpoint at {path}")
    shards = len(list(path.glob("*.distcp")))
    fallback = latest_complete(path.parent)
    use = f"load the latest complete one, {fallback.name}" if fallback else "no complete checkpoint is left beside it"
    raise IncompleteCheckpointError(f"refusing {path.name}: no {METADATA} ({shards} shard file(s) but the save never "
                                    f"finished); {use}")


def bytes_per_rank(path: str | Path) -> dict[int, int]:
    """Bytes of shard files each rank wrote into a DCP folder ({rank: bytes}); ``.metadata`` not counted."""
    out: dict[int, int] = {}
    for file in Path(path).iterdir():
        match = _SHARD_FILE.match(file.name)
        if match:
            out[int(match.group(1))] = out.get(int(match.group(1)), 0) + file.stat().st_size
    return dict(sorted(out.items()))


def metadata_bytes(path: str | Path) -> int:
    """Size of the ``.metadata`` file rank 0 writes last (0 when the save never finished)."""
    meta = Path(path) / METADATA
    return meta.stat().st_size if meta.is_file() else 0


def save_state(model: nn.Module, optimizer: Optimizer, path: str | Path,
               writer: FileSystemWriter | None = None) -> None:
    """Every rank writes its own shards of the model and Adam state with ``dcp.save``."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), storage_writer=writer)


def load_state(model: nn.Module, optimizer: Optimizer, path: str | Path, with_optimizer: bool = True) -> None:
    """Load a complete checkpoint into a model on any number of ranks (DCP re-cuts the shards); refuses an
    incomplete folder in one line. ``with_optimizer=False`` leaves Adam fresh (the rival a resume must beat)."""
    path = check_complete(path)
    if not with_optimizer:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(model, state["model"])
        return
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class FailingWriter(FileSystemWriter):
    """A ``FileSystemWriter`` whose rank ``fail_rank`` writes a partial shard and then fails: ``"enospc"`` raises
    ``OSError(ENOSPC)`` as a full disk does, ``"kill"`` SIGKILLs its own process mid-save (a lost node)."""

    def __init__(self, path: str | Path, fail_rank: int, failure: str) -> None:
        if failure not in FAILURES:
            raise ValueError(f"failure must be one of {FAILURES}, got {failure!r}")
        super().__init__(str(path))
        self.fail_rank, self.failure, self.folder = fail_rank, failure, Path(path)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Write as FileSystemWriter does, except on ``fail_rank``: part of a shard, then the failure."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank != self.fail_rank:
            return super().write_data(plan, planner)
        target = self.folder / f"__{rank}_0.distcp"
        with open(target, "wb") as half:
            half.write(b"\0" * PARTIAL_WRITE_BYTES)
        if self.failure == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))


def save_error_line(err: BaseException, path: str | Path) -> str:
    """One line for a failed save: which rank, what the OS said, and that the folder will never be loaded."""
    cause = err
    if isinstance(err, CheckpointException) and err.failures:
        rank, wrapped = sorted(err.failures.items())[0]
        cause = wrapped[0] if isinstance(wrapped, tuple) else getattr(wrapped, "exc", wrapped)   # (error, frames)
        where = f"rank {rank}"
    else:
        where = "this rank"
    said = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    free = free_bytes(path)
    if isinstance(cause, OSError) and cause.errno is not None:
        what = f"{os.strerror(cause.errno)} ({errno.errorcode.get(cause.errno, cause.errno)})"
    elif free is not None and free < FULL_DISK_FREE_BYTES:      # torch.save's zip writer hides the ENOSPC
        what = f"{os.strerror(errno.ENOSPC)} (ENOSPC): {free} bytes free where it writes (torch said {said})"
    else:
        what = said
    state = "incomplete (no .metadata), never loaded" if not is_complete(path) else "complete"
    return f"checkpoint {Path(path).name} not saved: {where}: {what}; the folder is {state}"


def free_bytes(path: str | Path) -> int | None:
    """Bytes free on the filesystem holding ``path`` (or its nearest existing parent); None if unreadable."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def folder_digest(path: str | Path) -> dict[str, str]:
    """{file name: sha256} of a checkpoint folder: equal before and after a failed save means it was untouched."""
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(Path(path).iterdir()) if f.is_file()}
