"""Start a launch's ranks from one process that has already imported torch: the rank forkserver, launcher side.

A fresh ``python -c`` per rank pays ``import torch`` (~280 MB of private memory on the CUDA build) once per
rank. The forkserver pays it once: :func:`labkit.comm.worker.serve_forks` imports torch and the target's
module, then forks every rank, which shares those pages copy-on-write (a 4-rank CPU run: ~2.1 GB as fresh
processes, ~1.2 GB forked). Only for CPU (gloo) runs: the server never touches CUDA, and the launching process
(a Jupyter kernel, which may have) is never forked. One server per ``launch()`` call, gone when it returns.

The server prints ``pid RANK PID`` as it forks and ``exit RANK CODE`` as it reaps; :class:`ForkedRank` turns
those lines into the ``pid`` / ``poll()`` / ``wait()`` / ``returncode`` the launcher uses for its ranks.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping

from labkit.core.clock import Deadline

SERVER_EXIT_GRACE_S = 2.0    # after its ranks are gone, how long the server gets to report them and exit
KILLED = -9                  # a rank's code when the server could not report it: it was killed with the server
_SERVER_CODE = ("import sys; from labkit.comm.worker import serve_forks; "
                "serve_forks(sys.argv[1], int(sys.argv[2]), sys.argv[3])")


START_METHODS = ("auto", "forkserver", "fresh")


def forkserver_available() -> bool:
    """True where ranks can be forked from a server (Linux: os.fork plus the parent-death signal)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def uses_forkserver(start_method: str, backend: str) -> bool:
    """Whether a launch forks its ranks: ``auto`` forks gloo (CPU) runs where it can; NCCL ranks start fresh."""
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    return start_method == "forkserver" or (start_method == "auto" and backend == "gloo" and forkserver_available())


class ForkedRank:
    """One rank forked by the server, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.returncode: int | None = None
        self._done = threading.Event()

    def poll(self) -> int | None:
        """The exit code once the server has reported it, else None."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the exit code is known (the server reports it, or :meth:`RankForkServer.close` sets it)."""
        self._done.wait(timeout)
        return self.returncode

    def finish(self, code: int) -> None:
        """Record the exit code (the first one reported wins)."""
        if self.returncode is None:
            self.returncode = code
        self._done.set()


class RankForkServer:
    """The server process for one launch: ``ranks`` fill in as it forks them; ``close()`` leaves nothing running."""

    def __init__(self, run_dir: Path, world_size: int, preload: str, env: Mapping[str, str]) -> None:
        self.err_path = run_dir / "forkserver.err"
        self.ranks = [ForkedRank() for _ in range(world_size)]
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER_CODE, str(run_dir), str(world_size), preload],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=dict(env),
                                         start_new_session=True)  # Ctrl-C reaches only the launcher, which stops it
        self._reader = threading.Thread(target=self._read_reports, daemon=True)
        self._reader.start()

    def _read_reports(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            fields = line.decode(errors="replace").split()
            if len(fields) != 3 or fields[0] not in ("pid", "exit") or not fields[1].isdigit() \
                    or not fields[2].lstrip("-").isdigit():
                continue  # something the preloaded module printed at import time
            kind, rank, value = fields[0], int(fields[1]), int(fields[2])
            if kind == "pid":
                self.ranks[rank].pid = value
            else:
                self.ranks[rank].finish(value)
        code = self.proc.wait()  # the server is gone: a rank it never forked gets its exit code
        for rank in self.ranks:
            rank.finish(code if rank.pid is None and code != 0 else KILLED)

    @property
    def failed_to_fork(self) -> bool:
        """True when the server exited before forking every rank (its stderr says why)."""
        return any(rank.pid is None for rank in self.ranks)

    def error_text(self, lines: int = 20) -> str:
        """The last lines the server wrote to stderr."""
        text = self.err_path.read_text(errors="replace") if self.err_path.exists() else ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def close(self, kill: Callable[[int], None], ranks_killed: bool = True) -> None:
        """Let the server reap its (already killed) ranks and exit, else ``kill`` its tree; every rank ends finished.

        The grace is only for a server whose every rank the launcher has killed by pid (``ranks_killed``): one
        still starting up (importing, forking) would fork ranks that run during the grace, so it is killed at once.
        """
        if ranks_killed:
            deadline = Deadline(SERVER_EXIT_GRACE_S)
            while self.proc.poll() is None and not deadline.expired:
                self._reader.join(0.02)
        kill(self.proc.pid)
        self.proc.wait()
        self._reader.join()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

