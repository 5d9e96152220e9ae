"""Run a function on N real processes with torch.distributed, from a notebook or a script: the launcher side.

``launch(fn, world_size)`` starts ``world_size`` Python processes (gloo on CPU, NCCL when there is one GPU per
rank) -- CPU ranks forked from a server that imported torch once (``labkit.comm.forkserver``), GPU ranks as fresh
processes -- each running :func:`labkit.comm.worker.run_rank`, which initialises the process group,
calls ``fn(*args, **kwargs)`` and reports back; ``launch`` returns the per-rank results in rank order. Every
run has a timeout; a failing rank's traceback is re-raised here; worker output is shown in rank order; no
child process outlives the call.

Under ``torchrun`` (or an MPI launcher) a script calls ``labkit.comm.worker.init_from_env()`` instead, so the
same training entry point scales from one CPU process to several nodes; ``labkit launch`` does either::

    torchrun --nproc-per-node=2 -m labkit launch labkit.comm.demos:all_reduce_sum
    labkit launch --world-size 3 labkit.comm.demos:all_reduce_sum                 # same, via launch()
"""
from __future__ import annotations

import importlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from labkit.comm.backend import check_world_size, choose_backend, world_size_limit
from labkit.comm.forkserver import ForkedRank, RankForkServer, uses_forkserver
from labkit.comm.ports import reserved_port
from labkit.comm.rank_watch import RankWatch
from labkit.comm.stop import pid_has_exited, stop_group
from labkit.core.clock import Deadline
from labkit.core.interrupts import signals_deferred
from labkit.core.procs import parse_target
from labkit.core.results import sigterm_as_interrupt
from labkit.core.validation import positive_int, positive_number

FAILURE_GRACE_S = 1.0    # after one rank fails, how long the others get to finish or report their own error
RUN_DIR_PREFIX = "labkit-launch-"   # + the launcher's pid: a later launch removes the folder if that pid is gone
POLL_S = 0.02            # how often the launcher looks at its ranks
_WORKER_CODE = "import sys; from labkit.comm.worker import run_rank; run_rank(sys.argv[1])"


class LaunchError(RuntimeError):
    """A multi-process run did not complete."""


class RankFailedError(LaunchError):
    """A rank raised (or died); ``.rank`` and ``.remote_traceback`` say which and where."""

    def __init__(self, rank: int, world_size: int, target: str, remote_traceback: str, summary: str = "") -> None:
        self.rank, self.world_size, self.remote_traceback, self.summary = rank, world_size, remote_traceback, summary
        super().__init__(f"rank {rank} of {world_size} failed running {target}"
                         f"{': ' + summary if summary else ''}\n\n"
                         f"--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}")


class LaunchTimeout(LaunchError, TimeoutError):
    """The run outlived its timeout; every process was killed."""


def target_name(fn: Callable | str) -> tuple[str, str]:
    """(module, qualified name) of an importable function; a clear error for lambdas and notebook functions."""
    if isinstance(fn, str):
        module, qualname = parse_target(fn)
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
        obj = resolve_target(module, qualname)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {module}:{qualname} ({err}); pass a module-level function") from None
    if not isinstance(fn, str) and obj is not fn:
        raise ValueError(f"{module}:{qualname} names a different object than the function given; "
                         "pass a plain module-level function (not a decorated or re-bound one)")
    return module, qualname


def resolve_target(module: str, qualname: str) -> Any:
    """The object ``module:qualname`` names (imported here, or in a worker process)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------------------------- launch
def launch(fn: Callable | str, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
           backend: str = "auto", timeout_s: float = 120.0, pg_timeout_s: float | None = None,
           env: dict | None = None, threads_per_rank: int = 1, show_output: bool = True,
           start_method: str = "auto", on_result: Callable[[int, Any], None] | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` processes in a process group; per-rank results in rank order.

    ``threads_per_rank`` defaults to 1: N ranks each starting one torch thread per core would oversubscribe the
    cores N-fold and time mostly contention. ``pg_timeout_s`` is torch.distributed's collective timeout.
    ``start_method``: ``"forkserver"`` forks the ranks from one process that imported torch (they share its
    memory), ``"fresh"`` starts a new interpreter per rank; ``"auto"`` forks gloo runs on Linux, NCCL runs fresh.
    ``on_result(rank, value)`` is called as each rank returns, so a caller keeps them through a timeout or Ctrl-C.
    """
    positive_number(timeout_s, "timeout_s", hint="a number of seconds")
    if pg_timeout_s is not None:
        positive_number(pg_timeout_s, "pg_timeout_s", hint="a number of seconds, or None for torch's default")
    positive_int(threads_per_rank, "threads_per_rank")
    backend = choose_backend(world_size, backend).backend
    check_world_size(world_size, world_size_limit(backend))
    forked = uses_forkserver(start_method, backend)
    module, qualname = target_name(fn)
    payload = {"module": module, "qualname": qualname, "args": tuple(args), "kwargs": dict(kwargs or {}),
               "backend": backend, "pg_timeout_s": pg_timeout_s, "threads": threads_per_rank}
    try:
        blob = pickle.dumps(payload)
    except Exception as err:  # noqa: BLE001 - any pickling failure gets the same advice
        raise ValueError(f"the args/kwargs for {module}:{qualname} cannot be pickled for the worker processes "
                         f"({type(err).__name__}: {err}); pass plain data (numbers, arrays, tensors, dicts)") from None
    remove_orphaned_run_dirs()
    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-") as tmp, \
            reserved_port() as port:        # held until the ranks are gone: rank 0's store cannot lose it to a peer
        run_dir = Path(tmp)
        (run_dir / "payload.pkl").write_bytes(blob)
        child_env = _child_env(env, world_size, threads_per_rank, port)
        return _run(run_dir, f"{module}:{qualname}", world_size, timeout_s, child_env, show_output,
                    preload=module if forked else None, on_result=on_result)


def remove_orphaned_run_dirs(tmp_root: str | Path | None = None) -> list[Path]:
    """Delete launch folders whose launcher died without cleaning up (killed with SIGKILL); returns them."""
    removed = []
    for path in Path(tmp_root or tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        pid_text = path.name[len(RUN_DIR_PREFIX):].split("-", 1)[0]
        if path.is_dir() and pid_text.isdigit() and pid_has_exited(int(pid_text)):   # gone, or a zombie
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _child_env(extra: Mapping[str, str] | None, world_size: int, threads: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    paths = [p or os.getcwd() for p in sys.path]  # the children import what this process can import
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(world_size), PYTHONUNBUFFERED="1", LABKIT_PARENT_PID=str(os.getpid()))
    for stale in ("TORCHELASTIC_RUN_ID", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "PMIX_RANK"):
        env.pop(stale, None)  # a notebook started under a launcher must not confuse the children
    return env


def _run(run_dir: Path, target: str, world_size: int, timeout_s: float, env: dict, show_output: bool,
         preload: str | None, on_result: Callable[[int, Any], None] | None = None) -> list:
    """Start the ranks (forked from a server that imported ``preload``, or fresh when it is None) and collect them."""
    procs: list[subprocess.Popen | ForkedRank] = []
    server, codes, watch, why_running, frozen = None, [], RankWatch(), "", {}
    try:
        if preload is not None:
            with signals_deferred():    # a signal inside Popen would lose the started server: it would fork on
                server = RankForkServer(run_dir, world_size, preload, env)
                procs = list(server.ranks)
        else:
            for rank in range(world_size):
                with signals_deferred():    # each started rank is recorded before an interrupt can unwind
                    procs.append(_start_fresh(run_dir, rank, env))
        still_running = _wait(procs, timeout_s, run_dir, on_result, watch)
        codes = [p.poll() for p in procs]       # before _stop kills the rest: who ended, and how
        why_running = watch.describe(still_running) if still_running else ""   # before the kill: who was frozen
        frozen = watch.frozen([r for r, c in enumerate(codes) if c is None])   # ... also when another rank failed
    finally:
        _stop(procs, server)
        if show_output and procs:
            print_outputs(run_dir, len(procs))
    if still_running and not _all_reported(run_dir, len(procs)):
        raise LaunchTimeout(f"{target} on {world_size} processes did not finish within timeout_s={timeout_s:g}; "
                            f"{why_running}. Every process was killed")
    if server is not None and server.failed_to_fork:
        raise LaunchError(f"{target}: the rank forkserver stopped before starting all {world_size} ranks "
                          f"(start_method='fresh' starts them without it):\n{server.error_text()}")
    return _collect(run_dir, codes, target, frozen)   # every rank reported: a timeout at teardown is no failure


def _start_fresh(run_dir: Path, rank: int, env: dict) -> subprocess.Popen:
    """One rank as a new interpreter, its output in the run folder."""
    with open(run_dir / f"{rank}.out", "wb") as out, open(run_dir / f"{rank}.err", "wb") as err:
        return subprocess.Popen([sys.executable, "-c", _WORKER_CODE, str(run_dir)], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                start_new_session=True)  # Ctrl-C reaches only this process, which stops the children


def _stop(procs: list[subprocess.Popen | ForkedRank], server: RankForkServer | None) -> None:
    """Kill every rank (and what it started) and the forkserver; wait until each has an exit code."""
    pids = [proc.pid for proc in procs]
    for pid in pids:
        if pid is not None:
            stop_group(pid)
    if server is not None:       # still forking (a pid unknown above): killed at once, or its new ranks would run
        every_rank_killed = len(pids) == len(server.ranks) and None not in pids
        server.close(stop_group, ranks_killed=every_rank_killed)  # also kills a rank forked after the loop above
        for proc in procs:
            if proc.pid is not None:
                stop_group(proc.pid)
    for proc in procs:
        proc.wait()


def _wait(procs: list[subprocess.Popen | ForkedRank], timeout_s: float, run_dir: Path,
          on_result: Callable[[int, Any], None] | None = None, watch: RankWatch | None = None) -> list[int]:
    """Wait for all ranks, or a failure (or every result reported) plus a short grace; the ranks still running at
    the timeout (else []). ``watch`` samples the running ranks' process states (who is frozen)."""
    deadline, grace, handed = Deadline(timeout_s), None, set()
    while True:
        _hand_over_results(run_dir, len(procs), handed, on_result)
        codes = [p.poll() for p in procs]
        running = [r for r, c in enumerate(codes) if c is None]
        if not running:
            return []
        if watch is not None:
            watch.sample({r: procs[r].pid for r in running})
        if grace is None and (any(c not in (None, 0) for c in codes) or _all_reported(run_dir, len(procs))):
            grace = Deadline(FAILURE_GRACE_S)
        if grace is not None and grace.expired:
            return []
        if deadline.expired:
            return running
        time.sleep(POLL_S)


def _hand_over_results(run_dir: Path, world_size: int, handed: set[int], on_result: Callable | None) -> None:
    """Call ``on_result(rank, value)`` once for each rank whose result file appeared since the last look."""
    for rank in [r for r in range(world_size) if on_result and r not in handed and (run_dir / f"{r}.result").exists()]:
        handed.add(rank)
        status, value = pickle.loads((run_dir / f"{rank}.result").read_bytes())
        if status == "ok":
            on_result(rank, value)


def _all_reported(run_dir: Path, world_size: int) -> bool:
    """True once every rank has written its result file (renamed into place whole by the worker)."""
    return all((run_dir / f"{rank}.result").exists() for rank in range(world_size))


def print_outputs(run_dir: Path, world_size: int) -> None:
    """Show each rank's captured stdout (then stderr), rank by rank, each line prefixed with its rank."""
    for stream, name in ((sys.stdout, "out"), (sys.stderr, "err")):
        for rank in range(world_size):
            path = run_dir / f"{rank}.{name}"
            text = path.read_text(errors="replace") if path.exists() else ""
            for line in text.splitlines():
                print(f"[rank {rank}] {line}", file=stream)
        stream.flush()


def _death(rank: int, code: int | None, run_dir: Path) -> tuple[str, str] | None:
    """(traceback text, summary) for a rank that ended without reporting, or None if it was still running."""
    if code is None or code == 0:
        return None
    err_path = run_dir / f"{rank}.err"
    err = err_path.read_text(errors="replace")[-2000:] if err_path.exists() else ""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"killed by {name}\n{err}", f"rank {rank} was killed by {name}{hint}"
    return f"process exited with code {code}\n{err}", f"the process died (exit code {code})"


def _collect(run_dir: Path, codes: list[int | None], target: str, frozen: Mapping[int, float] | None = None) -> list:
    """Every rank's result in rank order, or the first failure (a raise, or a death with its signal). A rank that
    was frozen (state T) while another failed is the cause: the failure was a peer's timeout waiting for it."""
    results, failures = [], []
    for rank, code in enumerate(codes):
        path = run_dir / f"{rank}.result"
        status, value = pickle.loads(path.read_bytes()) if path.exists() else ("died", None)
        if status == "ok":
            results.append(value)
        elif status == "error":
            failures.append((value["time"], rank, value["traceback"], value["type"]))
        elif (death := _death(rank, code, run_dir)) is not None:   # a signal death is the cause, not a knock-on
            failures.append((float("-inf") if code is not None and code < 0 else float("inf"), rank, *death))
    if failures:
        _, rank, tb, summary = min(failures)  # the first rank to fail is the cause; the rest are knock-on
        if frozen:
            names = ", ".join(f"rank {r} (for {s:.1f} s)" for r, s in sorted(frozen.items()))
            first = summary.splitlines()[0] if summary else "it failed"
            raise RankFailedError(rank, len(codes), target, tb,
                                  f"{names} stopped answering: the process was frozen (state T: stopped by SIGSTOP, "
                                  f"Ctrl-Z or a debugger); rank {rank} failed waiting for it ({first})")
        raise RankFailedError(rank, len(codes), target, tb, summary)
    if len(results) != len(codes):
        raise LaunchError(f"{target}: only {len(results)} of {len(codes)} ranks returned a result")
    return results
