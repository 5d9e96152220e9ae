"""The one way to stop a process group: what a launcher started in its own session, and everything it started.

A launched child (a rank, torchrun, mpiexec, a cluster node's daemon) runs with ``start_new_session=True``, so its
process-group id is its pid and one signal reaches its whole family, helpers re-parented after it exited included.
With ``grace_s`` a launcher first gets SIGTERM and that long to stop its workers and remove its temporary files
(torchrun and mpiexec do); then SIGKILL. Torch-free: the CLI and the cluster lab stop groups without loading torch.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone (or not ours, or no killpg) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError, AttributeError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen | int, *, grace_s: float = 0.0, reap_s: float | None = 10.0) -> None:
    """Stop the session ``proc`` leads (a Popen, or a process-group id): SIGTERM and up to ``grace_s`` seconds for
    it to end (a Popen only), then SIGKILL the group; a Popen is reaped (waiting up to ``reap_s``, None: for ever)."""
    pgid = proc if isinstance(proc, int) else proc.pid
    if grace_s > 0 and not isinstance(proc, int) and proc.poll() is None:
        signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    signal_group(pgid, signal.SIGKILL)
    if not isinstance(proc, int):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=reap_s)
