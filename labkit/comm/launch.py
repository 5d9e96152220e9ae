"""Run a function on N real processes with torch.distributed, from a notebook or a script.

``launch(fn, world_size)`` starts ``world_size`` fresh Python processes (gloo on CPU, NCCL when there is
one GPU per rank), initialises the process group in each, calls ``fn(*args, **kwargs)`` and returns the
per-rank results in rank order. Every run has a timeout; a failing rank's traceback is re-raised here;
worker output is shown in rank order; no child process outlives the call.

Under ``torchrun`` (or an MPI launcher) a script calls ``init_from_env()`` instead, so the same training
entry point scales from one CPU process to several nodes::

    torchrun --nproc-per-node=2 -m labkit.comm.launch labkit.comm.demos:all_reduce_sum
    python -m labkit.comm.launch --nproc 3 labkit.comm.demos:all_reduce_sum      # same, via launch()
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from labkit.core.machine import cpu_count
from labkit.core.validation import checked_int

BACKENDS = ("auto", "gloo", "nccl")
GLOO_RANKS_PER_CORE = 4  # each gloo rank is a whole Python process with torch (~300 MB, ~2-3 s to start)
FAILURE_GRACE_S = 1.0    # after one rank fails, how long the others get to finish or report their own error
PR_SET_PDEATHSIG = 1     # linux/prctl.h
_WORKER_CODE = "import sys; from labkit.comm.launch import _worker_main; _worker_main(sys.argv[1])"


class LaunchError(RuntimeError):
    """A multi-process run did not complete."""


class RankFailedError(LaunchError):
    """A rank raised (or died); ``.rank`` and ``.remote_traceback`` say which and where."""

    def __init__(self, rank: int, world_size: int, target: str, remote_traceback: str, summary: str = "") -> None:
        self.rank, self.world_size, self.remote_traceback, self.summary = rank, world_size, remote_traceback, summary
        super().__init__(f"rank {rank} of {world_size} failed running {target}"
                         f"{': ' + summary if summary else ''}\n\n"
                         f"--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}")


class LaunchTimeout(LaunchError):
    """The run outlived its timeout; every process was killed."""


# ---------------------------------------------------------------------------------------------- checks
@dataclass(frozen=True)
class BackendChoice:
    """The backend a run uses and the one-line reason a notebook prints next to its numbers."""

    backend: str      # "gloo" or "nccl"
    reason: str
    uses_gpus: bool   # True: rank r drives cuda:<local rank>; False: every rank computes on the CPU


def choose_backend(world_size: int, backend: str = "auto", local_world_size: int | None = None) -> BackendChoice:
    """The one backend rule: NCCL only when every rank on this node gets its own GPU, otherwise gloo (and why).

    Two ranks on one GPU fail with "invalid device ordinal" under NCCL, so 'auto' never picks it then, and an
    explicit 'nccl' that cannot work is refused up front. ``local_world_size`` is the ranks on this node
    (torchrun's LOCAL_WORLD_SIZE); it defaults to ``world_size`` (one node).
    """
    import torch
    import torch.distributed as dist

    world_size = checked_int(world_size, "world_size")
    local = world_size if local_world_size is None else checked_int(local_world_size, "local_world_size")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = dist.is_nccl_available()
    fits = gpus >= local and nccl
    if backend == "nccl" and not fits:
        raise ValueError(f"backend='nccl' needs one CUDA GPU per rank: {local} rank(s) on this node but {gpus} "
                         f"GPU(s) visible (NCCL available: {nccl}); use backend='gloo' or fewer ranks")
    if backend == "nccl" or (backend == "auto" and fits):
        return BackendChoice("nccl", f"NCCL: {local} rank(s) on {gpus} GPU(s), one GPU per rank", True)
    if backend == "gloo":
        why = "gloo as requested: every rank computes on the CPU"
    elif gpus == 0:
        why = "gloo: no CUDA GPU visible, so every rank is a CPU process"
    elif not nccl:
        why = f"gloo: {gpus} GPU(s) but this torch build has no NCCL, so every rank is a CPU process"
    else:
        why = (f"gloo: {local} ranks but only {gpus} GPU(s) (NCCL needs one GPU per rank), so every rank is a "
               "CPU process and these timings are CPU timings")
    return BackendChoice("gloo", why, False)


def resolve_backend(backend: str, world_size: int) -> str:
    """The backend name ``choose_backend`` picks (kept for callers that need only the name)."""
    return choose_backend(world_size, backend).backend


def check_data_size(world_size: int, num_samples: int, what: str = "the dataset") -> None:
    """One clear error when there are more ranks than samples to shard (a rank would get no data)."""
    checked_int(world_size, "world_size", maximum=max(1, int(num_samples)),
                hint=f"{what} has {num_samples} samples, so each rank needs at least one; use fewer ranks")


def check_world_size(world_size: int, backend: str) -> None:
    """Raise a clear ValueError when ``world_size`` is not an int >= 1 or more than this machine allows."""
    checked_int(world_size, "world_size")
    limit = GLOO_RANKS_PER_CORE * cpu_count()
    if backend == "gloo" and world_size > limit:
        raise ValueError(f"world_size={world_size} is more than this machine allows for gloo: at most "
                         f"{GLOO_RANKS_PER_CORE} processes per CPU core x {cpu_count()} cores = {limit}. "
                         "Every rank is a full Python process with torch; use fewer ranks, or GPUs with NCCL")


def target_name(fn: Callable | str) -> tuple[str, str]:
    """(module, qualified name) of an importable function; a clear error for lambdas and notebook functions."""
    if isinstance(fn, str):
        module, sep, qualname = fn.partition(":")
        if not sep or not module or not qualname:
            raise ValueError(f"a function given by name must read 'package.module:function', got {fn!r}")
    else:
        if not callable(fn):
            raise TypeError(f"fn must be a function, got {type(fn).__name__}")
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
        label = getattr(fn, "__name__", repr(fn))
        if module in (None, "__main__", "__mp_main__") or not qualname or "<" in qualname:
            raise ValueError(f"launch() cannot send {label!r} to the worker processes: they import the function "
                             f"by name, and a lambda, a nested function or a function defined in a notebook cell "
                             f"(module {module!r}) has no importable name. Move it into a module (a .py file next "
                             "to the notebook, or labkit) and import it from there")
    try:
        obj = _resolve(module, qualname)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {module}:{qualname} ({err}); pass a module-level function") from None
    if not isinstance(fn, str) and obj is not fn:
        raise ValueError(f"{module}:{qualname} names a different object than the function given; "
                         "pass a plain module-level function (not a decorated or re-bound one)")
    return module, qualname


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------------------- launch
def launch(fn: Callable | str, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
           backend: str = "auto", timeout_s: float = 120.0, pg_timeout_s: float | None = None,
           env: dict | None = None, threads_per_rank: int = 1, show_output: bool = True) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` processes in a process group; per-rank results in rank order.

    ``threads_per_rank`` defaults to 1: N ranks each starting one torch thread per core would oversubscribe the
    cores N-fold and time mostly contention. ``pg_timeout_s`` is torch.distributed's collective timeout.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    if pg_timeout_s is not None and not pg_timeout_s > 0:
        raise ValueError(f"pg_timeout_s must be > 0 seconds or None, got {pg_timeout_s!r}")
    if not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank must be an integer >= 1, got {threads_per_rank!r}")
    check_world_size(world_size, "gloo" if backend == "auto" else backend)
    backend = choose_backend(world_size, backend).backend
    check_world_size(world_size, backend)
    module, qualname = target_name(fn)
    payload = {"module": module, "qualname": qualname, "args": tuple(args), "kwargs": dict(kwargs or {}),
               "backend": backend, "pg_timeout_s": pg_timeout_s, "threads": threads_per_rank}
    try:
        blob = pickle.dumps(payload)
    except Exception as err:  # noqa: BLE001 - any pickling failure gets the same advice
        raise ValueError(f"the args/kwargs for {module}:{qualname} cannot be pickled for the worker processes "
                         f"({type(err).__name__}: {err}); pass plain data (numbers, arrays, tensors, dicts)") from None
    with _sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="labkit-launch-") as tmp:
        run_dir = Path(tmp)
        (run_dir / "payload.pkl").write_bytes(blob)
        return _run(run_dir, f"{module}:{qualname}", world_size, timeout_s, _child_env(env, world_size,
                    threads_per_rank), show_output)


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while ranks run: unwind, kill every rank, delete the temp dir, exit 143."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread; parent-death signals still cover workers
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def _child_env(extra: Mapping[str, str] | None, world_size: int, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    paths = [p or os.getcwd() for p in sys.path]  # the children import what this process can import
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(world_size), PYTHONUNBUFFERED="1", LABKIT_PARENT_PID=str(os.getpid()))
    for stale in ("TORCHELASTIC_RUN_ID", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "PMIX_RANK"):
        env.pop(stale, None)  # a notebook started under a launcher must not confuse the children
    return env


def _run(run_dir: Path, target: str, world_size: int, timeout_s: float, env: dict, show_output: bool) -> list:
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world_size):
            with open(run_dir / f"{rank}.out", "wb") as out, open(run_dir / f"{rank}.err", "wb") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", _WORKER_CODE, str(run_dir)], stdout=out, stderr=err,
                    stdin=subprocess.DEVNULL, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    start_new_session=True))  # Ctrl-C reaches only this process, which then stops the children
        still_running = _wait(procs, timeout_s)
    finally:
        for proc in procs:
            kill_tree(proc.pid)
            _kill_group(proc.pid)
        for proc in procs:
            proc.wait()
        if show_output and procs:
            print_outputs(run_dir, len(procs))
    if still_running:
        raise LaunchTimeout(f"{target} on {world_size} processes did not finish within timeout_s={timeout_s:g}; "
                            f"rank(s) {still_running} were still running (a hang, a deadlock in a collective, or "
                            "too little time for start-up). Every process was killed")
    return _collect(run_dir, procs, target)


def _wait(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    """Wait for all ranks, or a failure plus a short grace; the ranks still running at the timeout (else [])."""
    deadline = time.monotonic() + timeout_s
    grace_end = None
    while True:
        codes = [p.poll() for p in procs]
        running = [r for r, c in enumerate(codes) if c is None]
        if not running:
            return []
        if grace_end is None and any(c not in (None, 0) for c in codes):
            grace_end = time.monotonic() + FAILURE_GRACE_S
        if grace_end is not None and time.monotonic() > grace_end:
            return []
        if time.monotonic() > deadline:
            return running
        time.sleep(0.02)


def kill_tree(pid: int) -> None:
    """Kill a process and all its descendants (a rank may have started data-loader workers)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=5)


def _kill_group(pgid: int) -> None:
    """Kill what is left of a rank's process group (its own session), e.g. helpers re-parented after it exited."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        pass


def print_outputs(run_dir: Path, world_size: int) -> None:
    """Show each rank's captured stdout (then stderr), rank by rank, each line prefixed with its rank."""
    for stream, name in ((sys.stdout, "out"), (sys.stderr, "err")):
        for rank in range(world_size):
            path = run_dir / f"{rank}.{name}"
            text = path.read_text(errors="replace") if path.exists() else ""
            for line in text.splitlines():
                print(f"[rank {rank}] {line}", file=stream)
        stream.flush()


def _collect(run_dir: Path, procs: list[subprocess.Popen], target: str) -> list:
    results, failures = [], []
    for rank, proc in enumerate(procs):
        path = run_dir / f"{rank}.result"
        status, value = pickle.loads(path.read_bytes()) if path.exists() else ("died", None)
        if status == "ok":
            results.append(value)
        elif status == "error":
            failures.append((value["time"], rank, value["traceback"], value["type"]))
        elif proc.returncode not in (None, 0) and proc.returncode != -9:
            err = (run_dir / f"{rank}.err").read_text(errors="replace")[-2000:]
            failures.append((float("inf"), rank, f"process exited with code {proc.returncode}\n{err}",
                             f"the process died (exit code {proc.returncode})"))
    if failures:
        _, rank, tb, summary = min(failures)  # the first rank to fail is the cause; the rest are knock-on
        raise RankFailedError(rank, len(procs), target, tb, summary)
    if len(results) != len(procs):
        raise LaunchError(f"{target}: only {len(results)} of {len(procs)} ranks returned a result")
    return results


# ---------------------------------------------------------------------------------------------- worker side
def init_process_group(rank: int, world_size: int, local_rank: int, backend: str = "auto",
                       pg_timeout_s: float | None = None) -> str:
    """Initialise torch.distributed from MASTER_ADDR/MASTER_PORT; on NCCL bind this rank's GPU. Returns the backend."""
    import torch
    import torch.distributed as dist

    if backend == "auto":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend = choose_backend(world_size, "auto", local_world_size=local).backend
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        if world_size > 1:
            raise ValueError("MASTER_PORT is unset; torchrun sets it, otherwise export MASTER_ADDR and MASTER_PORT")
        os.environ["MASTER_PORT"] = str(free_port())
    timeout = {} if pg_timeout_s is None else {"timeout": timedelta(seconds=pg_timeout_s)}
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, **timeout)
    return backend


def init_from_env(backend: str = "auto", pg_timeout_s: float | None = None) -> tuple[int, int]:
    """For scripts under torchrun or mpiexec: join the process group the launcher describes; (rank, world_size)."""
    import torch.distributed as dist

    from labkit.comm.launch_env import detect_launcher_env

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    place = detect_launcher_env(os.environ)
    init_process_group(place.rank, place.world_size, place.local_rank, backend, pg_timeout_s)
    return place.rank, place.world_size


def _watch_parent(parent_pid: int) -> None:
    """Exit this worker if the launching process disappears, so a crashed notebook leaves no orphans."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(0.5)


def _to_cpu(value: Any) -> Any:
    import torch

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
        tmp.write_bytes(pickle.dumps(("error", {"time": time.time(), "type": "ValueError", "traceback":
                        f"ValueError: the function's return value cannot be pickled back to the parent: {err}\n"})))
    os.replace(tmp, run_dir / f"{rank}.result")


def _worker_main(run_dir_text: str) -> None:
    """Entry point of one launched rank (runs in the child process)."""
    run_dir = Path(run_dir_text)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    parent_pid = int(os.environ["LABKIT_PARENT_PID"])
    _die_with_parent(parent_pid)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    code = 1
    try:
        import torch
        import torch.distributed as dist

        payload = pickle.loads((run_dir / "payload.pkl").read_bytes())
        torch.set_num_threads(payload["threads"])
        init_process_group(rank, world_size, int(os.environ["LOCAL_RANK"]), payload["backend"],
                           payload["pg_timeout_s"])
        fn = _resolve(payload["module"], payload["qualname"])
        value = _to_cpu(fn(*payload["args"], **payload["kwargs"]))
        _write_result(run_dir, rank, ("ok", value))
        dist.destroy_process_group()
        code = 0
    except BaseException as err:  # noqa: BLE001 - every failure is reported to the parent
        summary = f"{type(err).__name__}: {err}".splitlines()[0][:300] if str(err) else type(err).__name__
        _write_result(run_dir, rank, ("error", {"time": time.time(), "type": summary,
                                                "traceback": traceback.format_exc()}))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# ---------------------------------------------------------------------------------------------- script entry
def torchrun_command(target: str, nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None) -> list[str]:
    """The torchrun command line that runs ``target`` ('package.module:function') through this module's entry point."""
    target_name(target)
    if nproc_per_node < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"need nproc_per_node >= 1, nnodes >= 1 and 0 <= node_rank < nnodes, got "
                         f"{nproc_per_node}, {nnodes}, {node_rank}")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [torchrun, f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc_per_node}",
            f"--master-addr={master_addr}", f"--master-port={master_port or free_port()}",
            "-m", "labkit.comm.launch", target]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m labkit.comm.launch [--nproc N] module:function``; under torchrun, joins torchrun's group."""
    parser = argparse.ArgumentParser(prog="python -m labkit.comm.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="the function to run, as package.module:function")
    parser.add_argument("--nproc", type=int, default=2, help="processes to launch when not under torchrun/mpiexec")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before every process is killed")
    args = parser.parse_args(argv)
    try:
        return _run_target(args.target, args.nproc, args.backend, args.timeout)
    except ValueError as err:  # bad input: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        return 2
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _run_target(target: str, nproc: int, backend: str, timeout_s: float) -> int:
    from labkit.comm.launch_env import detect_launcher_env

    if detect_launcher_env(os.environ).launcher != "single":  # started by torchrun / mpiexec: we are one rank
        import torch.distributed as dist

        fn = _resolve(*target_name(target))
        rank, world_size = init_from_env(backend, pg_timeout_s=timeout_s)
        result = fn()
        print(f"[rank {rank}/{world_size}] {target} -> {result!r}", flush=True)
        dist.destroy_process_group()
        return 0
    for rank, result in enumerate(launch(target, nproc, backend=backend, timeout_s=timeout_s)):
        print(f"rank {rank}: {result!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
