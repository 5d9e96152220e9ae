"""The rank side of a multi-process run: join the process group, run the function, report back.

``run_rank`` is what every process that :func:`labkit.comm.launch.launch` starts runs: it arms the parent-death
watchdogs (no orphans when a notebook crashes), joins the process group, calls the function named in the
payload and writes its result, or its traceback, where the launcher collects it. Under ``torchrun`` or an MPI
launcher a script calls :func:`init_from_env` instead and joins the group the launcher describes
(``labkit launch`` does that through :func:`run_in_launcher_group`). For CPU runs the ranks are forked from
:func:`serve_forks`, a server that imported torch once (``labkit.comm.forkserver``).
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from labkit.comm.backend import choose_backend
from labkit.comm.launch import LaunchError, resolve_target, target_name
from labkit.comm.ports import free_port
from labkit.comm.launch_env import detect_launcher_env
from labkit.core.clock import timestamp_s

PR_SET_PDEATHSIG = 1     # linux/prctl.h
PARENT_POLL_S = 0.5      # how often the watchdog thread checks that the launcher is still there


def rank_device() -> torch.device:
    """This rank's device: its own GPU under NCCL (``init_process_group`` made it current), else the CPU.

    The current device, not ``cuda:<rank>``: on a second node rank 8 drives that node's cuda:0.
    """
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def init_process_group(rank: int, world_size: int, local_rank: int, backend: str = "auto",
                       pg_timeout_s: float | None = None, local_world_size: int | None = None) -> str:
    """Initialise torch.distributed from MASTER_ADDR/MASTER_PORT; on NCCL bind this rank's GPU. Returns the backend.

    ``auto`` picks NCCL only when every rank on this node has a GPU of its own: the node's rank count is
    ``local_world_size`` (an MPI launcher's), else torchrun's ``LOCAL_WORLD_SIZE``, else ``world_size``.
    """
    if backend == "auto":
        local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend = choose_backend(world_size, "auto", local_world_size=local).backend
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        if world_size > 1:
            raise ValueError("MASTER_PORT is unset; torchrun sets it, otherwise export MASTER_ADDR and MASTER_PORT")
        os.environ["MASTER_PORT"] = str(free_port())
    timeout = {} if pg_timeout_s is None else {"timeout": timedelta(seconds=pg_timeout_s)}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(backend, store=_attempt_store(world_size, pg_timeout_s), rank=rank,
                                world_size=world_size, **timeout)
        return backend
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, **timeout)
    return backend


def _attempt_store(world_size: int, pg_timeout_s: float | None) -> dist.Store:
    """torchrun's agent store, under a prefix unique to this start of the workers.

    The agent's store outlives a restart of the workers (``--max-restarts``), so it still holds the last attempt's
    keys, gloo's peer addresses among them: a new rank could read a dead peer's address. The agents' restart
    counts cannot name the attempt (an agent restarted by a peer's failure does not count it), so every rank
    counts itself in: with W ranks per start, the n-th arrival belongs to start (n - 1) // W on every node.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timedelta(seconds=pg_timeout_s or 300))
    attempt = (store.add("labkit/ranks_started", 1) - 1) // world_size
    os.environ["LABKIT_START"] = str(attempt)      # which start of the workers this is, the same on every node
    return dist.PrefixStore(f"labkit/start{attempt}", store)


def ensure_master_addr_port() -> None:
    """Under an MPI launcher without MASTER_ADDR/MASTER_PORT: rank 0 picks them and broadcasts them by MPI."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    addr_port = (socket.gethostname(), free_port("0.0.0.0")) if comm.Get_rank() == 0 else None
    addr, port = comm.bcast(addr_port, root=0)
    os.environ.setdefault("MASTER_ADDR", addr)
    os.environ.setdefault("MASTER_PORT", str(port))


def init_from_env(backend: str = "auto", pg_timeout_s: float | None = None) -> tuple[int, int]:
    """For scripts under torchrun or mpiexec: join the process group the launcher describes; (rank, world_size)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    place = detect_launcher_env(os.environ)
    init_process_group(place.rank, place.world_size, place.local_rank, backend, pg_timeout_s,
                       local_world_size=place.local_world_size)
    return place.rank, place.world_size


def run_in_launcher_group(target: str, backend: str = "auto",
                          pg_timeout_s: float | None = None) -> tuple[int, int, Any]:
    """One rank under torchrun or mpiexec: join the launcher's group, call ``target`` ('module:function'), leave it.

    The function is imported before joining, so a bad name fails on every rank at once instead of leaving peers
    waiting for it. Returns (rank, world_size, what the function returned).
    """
    fn = resolve_target(*target_name(target))
    try:
        rank, world_size = init_from_env(backend, pg_timeout_s)
    except dist.DistError as err:      # nobody to meet: often a launcher's variables left over in a shell
        raise LaunchError(_join_failure(err)) from None
    mark_rank(rank)
    result = fn()
    dist.destroy_process_group()
    return rank, world_size, result


def print_rank_result(rank: int, world_size: int, target: str, result: Any) -> None:
    """'[rank R/W] TARGET -> RESULT' as one write: ranks share their launcher's stdout, and print's separate write
    of the newline let two ranks' lines run together (11 of 120 forked-agent runs under load)."""
    sys.stdout.write(f"[rank {rank}/{world_size}] {target} -> {result!r}\n")
    sys.stdout.flush()


RANK_MARKS_VAR = "LABKIT_RANK_MARKS"


def mark_rank(rank: int) -> None:
    """Leave ``rank<R>.pid`` in ``$LABKIT_RANK_MARKS`` (when set): which process is which rank, for a watcher that
    names a failed node's ranks (a forked worker's RANK is not in its /proc environ, set after the fork)."""
    folder = os.environ.get(RANK_MARKS_VAR)
    if folder:
        with contextlib.suppress(OSError):
            (Path(folder) / f"rank{rank}.pid").write_text(str(os.getpid()))


def _join_failure(err: BaseException) -> str:
    """One line for a rank that could not join its launcher's group: where it looked, and the likely cause."""
    place = detect_launcher_env(os.environ)
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    shown = [v for v in ("TORCHELASTIC_RUN_ID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "WORLD_SIZE",
                         "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if v in os.environ]
    cause = (str(err).strip().splitlines() or [type(err).__name__])[-1]
    return (f"rank {place.rank} of {place.world_size} could not join the {place.launcher} group at {where} "
            f"({cause}); if no {place.launcher} started this job, its variables are left over in your shell: "
            f"`unset {' '.join(shown)}`")


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this worker the moment its launcher dies (no orphans, no 0.5 s poll gap)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the polling watchdog below still covers us
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(3)


def _watch_parent(parent_pid: int) -> None:
    """Exit this worker if the launching process disappears, so a crashed notebook leaves no orphans."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(PARENT_POLL_S)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value) if type(value) in (list, tuple) else value
    return value


def _write_result(run_dir: Path, rank: int, record: tuple) -> None:
    tmp = run_dir / f"{rank}.result.tmp"
    try:
        tmp.write_bytes(pickle.dumps(record))
    except Exception as err:  # noqa: BLE001 - an unpicklable return value becomes an error report
        tmp.write_bytes(pickle.dumps(("error", {"time": timestamp_s(), "type": "ValueError", "traceback":
                        f"ValueError: the function's return value cannot be pickled back to the parent: {err}\n"})))
    os.replace(tmp, run_dir / f"{rank}.result")


def run_rank(run_dir_text: str) -> None:
    """Entry point of one launched rank (runs in the child process)."""
    run_dir = Path(run_dir_text)
    here = detect_launcher_env()          # the one reader of RANK, WORLD_SIZE, LOCAL_RANK (checked there)
    rank, world_size = here.rank, here.world_size
    parent_pid = int(os.environ["LABKIT_PARENT_PID"])
    _die_with_parent(parent_pid)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    code = 1
    try:
        payload = pickle.loads((run_dir / "payload.pkl").read_bytes())
        torch.set_num_threads(payload["threads"])
        init_process_group(rank, world_size, here.local_rank, payload["backend"],
                           payload["pg_timeout_s"])
        fn = resolve_target(payload["module"], payload["qualname"])
        value = _to_cpu(fn(*payload["args"], **payload["kwargs"]))
        _write_result(run_dir, rank, ("ok", value))
        dist.destroy_process_group()
        code = 0
    except BaseException as err:  # noqa: BLE001 - every failure is reported to the parent
        summary = f"{type(err).__name__}: {err}".splitlines()[0][:300] if str(err) else type(err).__name__
        _write_result(run_dir, rank, ("error", {"time": timestamp_s(), "type": summary,
                                                "traceback": traceback.format_exc()}))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve_forks(run_dir_text: str, world_size: int, preload: str) -> None:
    """Entry point of a rank forkserver: import ``preload``, fork ``world_size`` ranks, report each pid and exit code.

    Runs in a fresh child of the launcher that never touches CUDA (forking after CUDA is initialised is unsafe),
    so the ranks share this process's torch pages copy-on-write. Writes ``pid RANK PID`` and ``exit RANK CODE``
    lines to stdout; exits once every rank is reaped, or dies with the launcher (parent-death signal).
    """
    _die_with_parent(int(os.environ["LABKIT_PARENT_PID"]))
    with contextlib.suppress(Exception):
        importlib.import_module(preload)  # a failing import is reported by each rank, with its traceback
    if torch.cuda.is_initialized():
        sys.stderr.write(f"importing {preload} initialised CUDA; ranks cannot be forked from this process\n")
        sys.stderr.flush()
        os._exit(4)
    sys.stdout.flush()
    sys.stderr.flush()
    ranks = {}
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            _become_rank(Path(run_dir_text), rank)
        ranks[pid] = rank
        os.write(1, f"pid {rank} {pid}\n".encode())
    while ranks:
        pid, status = os.wait()
        if pid in ranks:
            os.write(1, f"exit {ranks.pop(pid)} {os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _become_rank(run_dir: Path, rank: int) -> None:
    """In a freshly forked child: own session, output to the rank's files, the rank's environment; run it."""
    try:
        os.setsid()  # the launcher kills the rank's whole process group (data-loader workers included)
        for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, run_dir / f"{rank}.out", os.O_WRONLY | os.O_CREAT),
                                (2, run_dir / f"{rank}.err", os.O_WRONLY | os.O_CREAT)):
            opened = os.open(name, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), LABKIT_PARENT_PID=str(os.getppid()))
        run_rank(str(run_dir))
    finally:
        os._exit(1)  # never return into the server's loop
