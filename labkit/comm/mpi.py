"""The MPI lane: is MPI here, which one, and run `labkit.comm.mpi_demos` under ``mpiexec`` (or torchrun) from Python.

``run_demo("allreduce", 3)`` runs ``mpiexec -n 3 python labkit/comm/mpi_demos.py allreduce`` with a timeout, kills
every process it started when time runs out (or the cell is interrupted), and returns each rank's result and
output in rank order. A rank that raises comes back as ``MpiRankError`` carrying that rank's traceback.

The numpy-only demos are started by file path rather than ``-m labkit.comm.mpi_demos``: importing the ``labkit``
package imports torch (~3 s per rank on a small CPU), which those demos do not need.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from labkit.comm import mpi_demos
from labkit.comm.backend import check_world_size
from labkit.comm.bench import DEFAULT_SIZES_BYTES, BenchRow, bandwidths_gb_s, check_sizes
from labkit.comm.collectives import allreduce
from labkit.comm.leftovers import removing_mpi_leftovers
from labkit.comm.ports import reserved_port
from labkit.comm.stop import stop_group
from labkit.core.clock import Deadline, now_s
from labkit.core.machine import cpu_count
from labkit.core.validation import checked_int, positive_int, positive_number

INSTALL_HINT = 'pip install -e ".[mpi]"  (mpi4py plus the MPICH runtime wheel, from PyPI)'
LAUNCHERS = ("mpiexec", "torchrun")
STALE_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
                   "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMI_ID", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                   "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "PMIX_RANK")


class MpiError(RuntimeError):
    """An MPI run did not complete."""


class MpiUnavailableError(MpiError):
    """mpi4py or an ``mpiexec`` is missing; the message says how to install them."""


class MpiTimeout(MpiError):
    """The run outlived ``timeout_s``; every process it started was killed."""


class MpiRankError(MpiError):
    """A rank raised; ``.rank`` and ``.remote_traceback`` say which and where."""

    def __init__(self, rank: int, world_size: int, demo: str, remote_traceback: str) -> None:
        self.rank, self.world_size, self.remote_traceback = rank, world_size, remote_traceback
        super().__init__(f"rank {rank} of {world_size} raised in MPI demo {demo!r}\n\n"
                         f"--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}")


@dataclass(frozen=True)
class MpiInfo:
    """Whether the MPI lane can run here, with which MPI library and launcher."""

    available: bool
    implementation: str | None      # the library mpi4py loads: "MPICH", "Open MPI", "Intel MPI", ...
    version: str | None
    mpiexec_path: str | None
    reason: str
    mpiexec_flavor: str | None = None  # "hydra" (MPICH, Intel MPI), "openmpi" or "unknown"

    def __str__(self) -> str:
        if not self.available:
            return f"MPI not available: {self.reason}"
        return f"{self.implementation} {self.version} (mpiexec: {self.mpiexec_path}, {self.mpiexec_flavor})"


def find_mpiexec() -> str | None:
    """The ``mpiexec`` next to this Python (the one the mpi4py wheels pair with) or else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def _mpiexec_flavor(mpiexec: str) -> str:
    """'hydra', 'openmpi' or 'unknown', from ``mpiexec --version``."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "HYDRA" in text or "Intel(R) MPI" in text:
        return "hydra"
    return "openmpi" if "Open MPI" in text or "OpenRTE" in text else "unknown"


_VENDOR_CODE = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
                "name, ver = MPI.get_vendor(); print(name); print('.'.join(map(str, ver)))")


def mpi_info(timeout_s: float = 30.0) -> MpiInfo:
    """Detect mpi4py, the MPI library it loads and an ``mpiexec`` (in a subprocess: MPI never starts here)."""
    mpiexec = find_mpiexec()
    if importlib.util.find_spec("mpi4py") is None:
        return MpiInfo(False, None, None, mpiexec, f"mpi4py is not installed; {INSTALL_HINT}")
    try:
        probe = subprocess.run([sys.executable, "-c", _VENDOR_CODE], capture_output=True, text=True,
                               timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return MpiInfo(False, None, None, mpiexec, f"loading the MPI library took over {timeout_s:g} s")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return MpiInfo(False, None, None, mpiexec, f"mpi4py cannot load an MPI library ({last}); {INSTALL_HINT}")
    name, version = probe.stdout.split()[:2]
    if mpiexec is None:
        return MpiInfo(False, name, version, None, f"no mpiexec next to {sys.executable} or on PATH; {INSTALL_HINT}")
    return MpiInfo(True, name, version, mpiexec, "mpi4py and mpiexec found", _mpiexec_flavor(mpiexec))


@dataclass
class DemoRun:
    """What one launch of a demo gave back: per-rank results and output, in rank order."""

    demo: str
    launcher: str
    world_size: int
    results: list[dict[str, Any]]
    outputs: list[str]
    wall_s: float
    command: list[str] = field(repr=False)

    def show(self) -> None:
        """Print every rank's output, rank by rank, each line tagged with its rank."""
        for rank, text in enumerate(self.outputs):
            for line in text.splitlines():
                print(f"[rank {rank}] {line}")


def rank_limit(oversubscribe: bool) -> tuple[int, str] | None:
    """(most MPI ranks without oversubscribing the cores, why), or None when oversubscription was asked for."""
    if oversubscribe:
        return None
    cores = cpu_count()
    return cores, (f"more ranks than the {cores} CPU core(s) here run slowly, since MPI ranks busy-poll while they "
                   "wait; pass oversubscribe=True to allow it anyway (fine for correctness demos; Open MPI's mpiexec "
                   "also needs --oversubscribe, which run_demo adds)")


def mpiexec_command(info: MpiInfo, world_size: int, oversubscribe: bool) -> list[str]:
    """The launcher part of the command line: single host, no ssh (hydra's fork launcher)."""
    cmd = [str(info.mpiexec_path), "-n", str(world_size)]
    if info.mpiexec_flavor == "hydra":
        cmd += ["-launcher", "fork"]
    elif info.mpiexec_flavor == "openmpi":
        cmd += ["--oversubscribe"] if oversubscribe else []
        cmd += ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return cmd


def _child_env(result_dir: Path, extra: Mapping[str, str] | None, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STALE_VARIABLES}
    repo_root = str(Path(mpi_demos.__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([repo_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    # TMPDIR: the run's folder, deleted after it, so torchrun's torchelastic_* folders and error files go with it
    env.update(PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TMPDIR=str(result_dir),
               **{mpi_demos.RESULT_DIR_ENV: str(result_dir)})
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def run_demo(demo: str, world_size: int, *, launcher: str = "mpiexec", timeout_s: float = 60.0,
             oversubscribe: bool = False, echo: bool = True, env: Mapping[str, str] | None = None,
             mpiexec_args: Sequence[str] = (), wrap: Callable[[list[str]], list[str]] | None = None,
             **kwargs: Any) -> DemoRun:
    """Run ``labkit.comm.mpi_demos <demo> key=value ...`` on ``world_size`` ranks under mpiexec or torchrun.

    ``mpiexec_args`` replace the single-host launcher options (e.g. hosts and a launcher of their own) and ``wrap``
    turns the whole command line into the one to run (e.g. inside an emulated node): ``labkit.cluster.mpi_nodes``.
    """
    if demo not in mpi_demos.DEMOS:
        raise ValueError(f"demo must be one of {sorted(mpi_demos.DEMOS)}, got {demo!r}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    positive_number(timeout_s, "timeout_s", hint="a number of seconds")
    check_world_size(world_size, rank_limit(oversubscribe))
    script = [sys.executable, str(Path(mpi_demos.__file__).resolve()), demo]
    script += [f"{k}={json.dumps(v)}" for k, v in kwargs.items()]
    if launcher == "mpiexec":
        info = mpi_info()
        if not info.available:
            raise MpiUnavailableError(f"cannot run {demo!r} under mpiexec: {info.reason}")
        launch_opts = list(mpiexec_args) or mpiexec_command(info, world_size, oversubscribe)[1:]
        command = [str(info.mpiexec_path), *launch_opts, *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={world_size}"] + script[1:]
    # backstop if this Python process dies mid-run: Hydra's mpiexec then ends the job by itself
    extra = {"MPIEXEC_TIMEOUT": str(int(timeout_s) + 10), **(env or {})}
    command = wrap(command) if wrap is not None else command
    with tempfile.TemporaryDirectory(prefix="labkit-mpi-") as tmp, removing_mpi_leftovers(), reserved_port() as port:
        result_dir = Path(tmp)
        os.chmod(result_dir, 0o777)          # ranks in another user namespace write here too
        wall_s, code = _launch(command, result_dir, _child_env(result_dir, extra, port), timeout_s, demo, world_size)
        run = DemoRun(demo, launcher, world_size, *_collect(result_dir, world_size, demo, code), wall_s, command)
    if echo:
        run.show()
    return run


FAILURE_GRACE_S = 1.0  # after one rank reports an error, how long the others get before everything is stopped
STOP_GRACE_S = 2.0     # SIGTERM gives mpiexec this long to stop its ranks and delete its /tmp files before SIGKILL
POLL_S = 0.05          # how often the runner looks at the launcher and the ranks' records


def _launch(command: list[str], result_dir: Path, env: dict, timeout_s: float, demo: str,
            world_size: int) -> tuple[float, int]:
    """Start the launcher in its own session; stop it on timeout or soon after a rank fails; kill what is left."""
    start_s, deadline, grace = now_s(), Deadline(timeout_s), None
    with open(result_dir / "launcher.out", "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                if deadline.expired:
                    stop_group(proc, grace_s=STOP_GRACE_S)
                    proc.wait()
                    raise MpiTimeout(f"MPI demo {demo!r} on {world_size} ranks did not finish within "
                                     f"timeout_s={timeout_s:g}; every process was killed. Last launcher output:\n"
                                     f"{_tail(result_dir / 'launcher.out')}")
                if grace is None and _a_rank_failed(result_dir):
                    grace = Deadline(FAILURE_GRACE_S)  # peers blocked in a collective would wait for it forever
                if grace is not None and grace.expired:
                    break
                time.sleep(POLL_S)
        finally:
            stop_group(proc, grace_s=STOP_GRACE_S)  # no-op after a clean exit; stops all on an error or Ctrl-C
    return now_s() - start_s, proc.wait()


def _a_rank_failed(result_dir: Path) -> bool:
    """True when some rank has already written an error record."""
    return any(not json.loads(p.read_text())["ok"] for p in result_dir.glob("rank*.json"))


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _collect(result_dir: Path, world_size: int, demo: str, code: int) -> tuple[list[dict], list[str]]:
    """Per-rank results and outputs; the first rank's error (by time) becomes MpiRankError."""
    outputs = [_tail(result_dir / f"rank{r}.out", 100_000) for r in range(world_size)]
    records = [mpi_demos.read_record(result_dir, r) for r in range(world_size)]
    errors = sorted((rec["time"], r, rec["traceback"]) for r, rec in enumerate(records)
                    if rec is not None and not rec["ok"])
    if errors:
        _, rank, tb = errors[0]
        raise MpiRankError(rank, world_size, demo, tb)
    missing = [r for r, rec in enumerate(records) if rec is None]
    if missing or code != 0:
        raise MpiError(f"MPI demo {demo!r}: launcher exited with code {code}; rank(s) {missing} returned no result."
                       f" Launcher output:\n{_tail(result_dir / 'launcher.out')}")
    return [rec["result"] for rec in records], outputs


def gather_arrays(run: DemoRun, key: str) -> np.ndarray:
    """Stack one array-valued result across ranks: shape (world_size, ...)."""
    return np.stack([np.asarray(r[key]) for r in run.results])


def ring_log(run: DemoRun) -> list[tuple[int, int, int, int, int]]:
    """The ring demo's messages from every rank, as sorted (step, sender, receiver, chunk, nbytes) rows."""
    return sorted(tuple(int(x) for x in row) for result in run.results for row in result["steps"])


def simulated_ring_log(run: DemoRun) -> list[tuple[int, int, int, int, int]]:
    """The same rows from ``labkit.comm.collectives``' simulated ring, fed the ranks' own inputs."""
    sim = allreduce([np.asarray(r["input"]) for r in run.results], algorithm="ring", op="sum")
    return sorted((s.step, s.sender, s.receiver, int(s.chunk), s.nbytes) for s in sim.steps)


def mpi_allreduce_benchmark(world_size: int, sizes_bytes: Sequence[int] | None = None, iters: int = 20,
                            warmup: int = 5, *, oversubscribe: bool = False, timeout_s: float = 300.0) -> list:
    """MPI ``Allreduce`` timed like ``labkit.comm.bench.allreduce_benchmark`` (gloo/NCCL): same rows, same busbw."""
    sizes = check_sizes(sizes_bytes or DEFAULT_SIZES_BYTES, "float32")
    iters, warmup = positive_int(iters, "iters"), checked_int(warmup, "warmup", minimum=0)
    info = mpi_info()
    run = run_demo("bench", world_size, oversubscribe=oversubscribe, timeout_s=timeout_s, echo=False,
                   sizes_bytes=sizes, iters=iters, warmup=warmup)
    device = f"CPU ({world_size} MPI processes on {cpu_count()} cores)"
    rows = []
    for r in run.results[0]["rows"]:
        algbw, busbw = bandwidths_gb_s(r["size_bytes"], r["time_s"], world_size)
        rows.append(BenchRow(r["size_bytes"], r["count"], "float32", world_size, f"MPI ({info.implementation})",
                             r["time_s"], algbw, busbw, r["wrong"], device, float(r.get("cpu_share", 1.0))))
    return rows
