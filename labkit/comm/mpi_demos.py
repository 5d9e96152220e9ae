"""Programs run under ``mpiexec``: point-to-point, Allreduce, a ring all-reduce from Sendrecv, a benchmark, sync SGD.

From a terminal (after ``pip install -e ".[mpi]"``)::

    mpiexec -n 2 python -m labkit.comm.mpi_demos p2p
    mpiexec -n 3 python -m labkit.comm.mpi_demos ring length=10
    mpiexec -n 2 python -m labkit.comm.mpi_demos torch_sgd steps=5      # the same script also runs under torchrun:
    torchrun --standalone --nproc-per-node=2 -m labkit.comm.mpi_demos torch_sgd steps=5

From Python, ``labkit.comm.mpi.run_demo(name, world_size, **kwargs)`` does the launching, the timeout and the cleanup.
This module needs only numpy and the torch-free corners of ``labkit`` (mpi4py is optional, so it is imported by
the demos that use it); the demos that need torch (sync SGD under mpiexec) live in
``labkit.parallel.data.sync_sgd_mpi``, imported only when one of them runs. So run by file path
(``mpiexec -n 3 python labkit/comm/mpi_demos.py ring``) the numpy-only demos start without torch on every rank
(~3 s per rank on a small CPU).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

from labkit.comm.launch_env import detect_launcher_env
from labkit.core.clock import now_s, timestamp_s
from labkit.core.contention import share_mark, share_since

RESULT_DIR_ENV = "LABKIT_MPI_RESULT_DIR"


def demo_values(rank: int, length: int) -> np.ndarray:
    """What rank ``rank`` starts with: 10*rank + 1, 10*rank + 2, ... (float64, exact integers)."""
    return np.arange(length, dtype=np.float64) + 10 * rank + 1


# ---------------------------------------------------------------------------------------- MPI demos (numpy only)
def p2p(comm: Any, length: int = 8) -> dict:
    """Rank 0 ``Send``s a NumPy buffer to rank 1, which pre-allocates the receive buffer and ``Recv``s into it."""
    from mpi4py import MPI

    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        raise ValueError("p2p needs world_size >= 2 (a sender and a receiver)")
    buf = demo_values(0, length) if rank == 0 else np.zeros(length, dtype=np.float64)  # receiver allocates first
    before = buf.copy()
    status = MPI.Status()
    if rank == 0:
        comm.Send([buf, MPI.DOUBLE], dest=1, tag=7)
    elif rank == 1:
        comm.Recv([buf, MPI.DOUBLE], source=0, tag=7, status=status)
        count, source = status.Get_count(MPI.DOUBLE), status.Get_source()
        print(f"received {count} doubles from rank {source} (tag {status.Get_tag()})")
    return {"before": before, "after": buf, "source": status.Get_source() if rank == 1 else None}


def allreduce(comm: Any, length: int = 4) -> dict:
    """``Allreduce`` with ``MPI.SUM``: every rank ends with the element-wise sum of all ranks' arrays."""
    from mpi4py import MPI

    send = demo_values(comm.Get_rank(), length)
    recv = np.empty_like(send)
    comm.Allreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], op=MPI.SUM)
    print(f"before {send.tolist()} -> after {recv.tolist()}")
    return {"before": send, "after": recv}


def ring_allreduce(comm: Any, data: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    """Ring all-reduce (sum) from ``Sendrecv``: reduce-scatter then all-gather, 2(R-1) steps.

    Patarasuk & Yuan 2009 ("Bandwidth optimal all-reduce algorithms for clusters of workstations").
    Chunk c is ``np.array_split(data, R)[c]``. Reduce-scatter step s: rank r sends chunk (r - s) mod R to rank
    r+1 and adds the chunk it receives; after R-1 steps rank r owns the full sum of chunk (r + 1) mod R.
    All-gather step s: rank r forwards chunk (r + 1 - s) mod R. Returns (result, this rank's sends as
    [step, sender, receiver, chunk, nbytes]).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    chunks = [c.copy() for c in np.array_split(np.asarray(data, dtype=np.float64), size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    log: list[list[int]] = []
    for phase in range(2):                      # 0: reduce-scatter, 1: all-gather
        for s in range(size - 1):
            send_c, recv_c = (rank - s + phase) % size, (rank - s - 1 + phase) % size
            incoming = np.empty_like(chunks[recv_c])
            comm.Sendrecv(chunks[send_c], dest=right, sendtag=phase, recvbuf=incoming, source=left, recvtag=phase)
            log.append([phase * (size - 1) + s, rank, right, send_c, int(chunks[send_c].nbytes)])
            chunks[recv_c] = chunks[recv_c] + incoming if phase == 0 else incoming
    return np.concatenate(chunks), log


def ring(comm: Any, length: int = 10, seed: int | None = None) -> dict:
    """The ring all-reduce next to MPI's own ``Allreduce`` on the same input."""
    from mpi4py import MPI

    rank = comm.Get_rank()
    if seed is None:
        data = demo_values(rank, length)
    else:
        data = np.random.default_rng([seed, rank]).standard_normal(length)
    ring_out, log = ring_allreduce(comm, data)
    reference = np.empty_like(data)
    comm.Allreduce([data, MPI.DOUBLE], [reference, MPI.DOUBLE], op=MPI.SUM)
    print(f"ring {ring_out[:4].tolist()}... Allreduce {reference[:4].tolist()}... ({len(log)} sends)")
    return {"input": data, "ring": ring_out, "allreduce": reference, "steps": log}


def bench(comm: Any, sizes_bytes: list[int] | None = None, iters: int = 20, warmup: int = 5) -> dict:
    """Time in-place ``Allreduce`` (sum, float32) per message size, the way nccl-tests and labkit.comm.bench do.

    Per size: check the sum once (fill with rank+1, count wrong elements), warm up, Barrier, then time ``iters``
    back-to-back calls on the kit's one clock (``labkit.core.clock.now_s``, a steady high-resolution timer, as
    ``MPI.Wtime`` is); the time per call is averaged over ranks, the CPU share is the worst rank's. Bandwidths are
    derived by the caller (``labkit.comm.mpi.mpi_allreduce_benchmark``) with the same formulas as the gloo benchmark.
    """
    from mpi4py import MPI

    sizes_bytes = sizes_bytes or [4 ** k for k in range(2, 13)]
    size, rows = comm.Get_size(), []
    for nbytes in sizes_bytes:
        buf = np.full(max(nbytes // 4, 1), comm.Get_rank() + 1, dtype=np.float32)
        comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)
        wrong = int(np.sum(buf != size * (size + 1) / 2))
        buf[:] = 0                                   # zeros stay zeros however often they are summed
        for _ in range(warmup):
            comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)
        comm.Barrier()
        mark, start_s = share_mark(), now_s()
        for _ in range(iters):
            comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)
        per_call_s = (now_s() - start_s) / iters
        share = share_since(mark).share          # a waiting MPI rank busy-polls: below 1, it was kept off a core
        rows.append({"size_bytes": int(buf.nbytes), "count": int(buf.size),
                     "time_s": comm.allreduce(per_call_s, op=MPI.SUM) / size,
                     "wrong": comm.allreduce(wrong, op=MPI.SUM), "cpu_share": comm.allreduce(share, op=MPI.MIN)})
    return {"rows": rows}


def raise_on_rank(comm: Any, rank: int = 1) -> dict:
    """Error-path demo: rank ``rank`` raises while the others wait in a Barrier (they must not hang)."""
    if comm.Get_rank() == rank:
        raise ValueError(f"rank {rank} raises on purpose")
    comm.Barrier()
    return {}


def sleep(comm: Any, seconds: float = 60.0) -> dict:
    """Error-path demo: every rank sleeps (a stand-in for a hang), so the caller's timeout must fire."""
    time.sleep(seconds)
    return {}


def raise_without_mpi(rank: int = 1) -> dict:
    """Error-path demo without MPI calls: rank ``rank`` raises, the others wait (nothing MPI-side stops them)."""
    if detect_launcher_env().rank == rank:
        raise ValueError(f"rank {rank} raises on purpose (no MPI.Abort here: the runner must stop the rest)")
    time.sleep(120)
    return {}


TORCH_DEMOS_MODULE = "labkit.parallel.data.sync_sgd_mpi"  # sgd, torch_sgd: imported only when one of them runs
# name -> (kind, module): "mpi" demos get MPI.COMM_WORLD, "torch" demos find their rank from the launcher's env;
# module None is this one, so the numpy-only demos start without importing torch
DEMOS: dict[str, tuple[str, str | None]] = {
    "p2p": ("mpi", None), "allreduce": ("mpi", None), "ring": ("mpi", None), "bench": ("mpi", None),
    "sgd": ("mpi", TORCH_DEMOS_MODULE), "torch_sgd": ("torch", TORCH_DEMOS_MODULE),
    "raise_on_rank": ("mpi", None), "sleep": ("mpi", None), "raise_without_mpi": ("torch", None),
}


def demo_function(name: str) -> Callable[..., dict]:
    """The function that runs demo ``name`` (from this module, or imported from the torch demos' module)."""
    kind, module = DEMOS[name]
    return getattr(sys.modules[__name__] if module is None else importlib.import_module(module), name)


# ---------------------------------------------------------------------------------------- plumbing
def _plain(value: Any) -> Any:
    """JSON-ready copy: arrays become lists, numpy scalars Python numbers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def write_record(result_dir: Path, rank: int, record: dict) -> None:
    """Write one rank's record atomically (``rank{r}.json``)."""
    tmp = result_dir / f"rank{rank}.json.tmp"
    tmp.write_text(json.dumps(_plain(record)))
    os.replace(tmp, result_dir / f"rank{rank}.json")


def read_record(result_dir: Path, rank: int) -> dict | None:
    """One rank's record, or None when it wrote none (it was killed, or never started)."""
    path = result_dir / f"rank{rank}.json"
    return json.loads(path.read_text()) if path.exists() else None


def parse_args(argv: list[str]) -> tuple[str, dict]:
    """``NAME key=value ...`` (values as JSON, else strings) -> (name, kwargs); a clear error otherwise."""
    if not argv or argv[0] not in DEMOS:
        raise SystemExit(f"usage: python -m labkit.comm.mpi_demos NAME [key=value ...]; NAME is one of {sorted(DEMOS)}")
    kwargs = {}
    for item in argv[1:]:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"arguments read key=value (values as JSON), got {item!r}")
        try:
            kwargs[key] = json.loads(text)
        except json.JSONDecodeError:
            kwargs[key] = text
    return argv[0], kwargs


def main(argv: list[str] | None = None) -> int:
    """Run one demo on this rank; under ``labkit.comm.mpi.run_demo`` write its result/traceback and output to files."""
    name, kwargs = parse_args(sys.argv[1:] if argv is None else argv)
    fn, kind = demo_function(name), DEMOS[name][0]
    comm = None
    if kind == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
    else:
        rank = detect_launcher_env().rank
    result_dir = Path(os.environ[RESULT_DIR_ENV]) if os.environ.get(RESULT_DIR_ENV) else None
    if result_dir is not None:  # per-rank output file, shown in rank order by the caller
        sys.stdout = sys.stderr = open(result_dir / f"rank{rank}.out", "w", buffering=1)
    try:
        result = fn(comm, **kwargs) if kind == "mpi" else fn(**kwargs)
    except BaseException:  # noqa: BLE001 - every failure is reported, then the whole job is stopped
        tb = traceback.format_exc()
        if result_dir is not None:
            write_record(result_dir, rank, {"ok": False, "time": timestamp_s(), "traceback": tb})
        print(tb, file=sys.__stderr__, flush=True)
        if comm is not None and comm.Get_size() > 1:
            comm.Abort(1)  # peers blocked in a collective would otherwise wait forever
        return 1
    if result_dir is not None:
        write_record(result_dir, rank, {"ok": True, "time": timestamp_s(), "result": result})
    elif rank == 0:
        print(json.dumps(_plain(result))[:2000])
    if kind == "torch":  # the result is safe on disk: skip interpreter teardown, where torch's C++ threads
        sys.stdout.flush()  # occasionally abort ("terminate called without an active exception") under torchrun
        sys.stderr.flush()
        _finalize_mpi_if_started()
        os._exit(0)
    return 0


def _finalize_mpi_if_started() -> None:
    """os._exit skips mpi4py's atexit MPI_Finalize; Open MPI's mpiexec then fails the job (exit 1, "exited
    improperly", as on the H100 box), so a torch demo that also used MPI (mpi_too) finalizes it first."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # run by file path: don't let labkit/comm/'s own files shadow top-level modules
    sys.exit(main())
