"""The one way to stop what a launcher started: its process group and every process it started, helpers included.

A launched child (a rank, torchrun, mpiexec, a cluster node's daemon) runs with ``start_new_session=True``, so its
process-group id is its pid and one signal reaches its whole family, helpers re-parented after it exited included.
Its descendants are also read (psutil) before any signal, so a child that started a session of its own (a forked
rank, a data-loader worker) goes too. With ``grace_s`` the launcher first gets SIGTERM and that long to stop its
workers and remove its temporary files (torchrun and mpiexec do); then SIGKILL. Torch-free: the CLI and the cluster
lab stop groups without loading torch.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil

from labkit.core.clock import Deadline

# after SIGKILL: how long to wait for the family to vanish (a large process takes a moment to exit)
VANISH_S = 5.0


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone (or not ours, or no killpg) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError, AttributeError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen | int, *, grace_s: float = 0.0, reap_s: float | None = 10.0) -> None:
    """Stop ``proc`` (a Popen, or a pid), the session it leads and every process it started.

    With ``grace_s`` the root gets SIGTERM first and up to ``grace_s`` seconds for its family to end by itself;
    then whatever is left is killed (SIGKILL to the group and to each descendant). A Popen is reaped, waiting up to
    ``reap_s`` (None: for ever), so its ``returncode`` is the real one; a pid given as a number is not reaped here
    (its parent's own ``wait`` does that).
    """
    pid = proc if isinstance(proc, int) else proc.pid
    family = [] if _reaped(proc) else _descendants(pid)  # read first: a parent's death re-parents its children away
    if grace_s > 0 and _running(proc):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        _wait_gone(proc, family, grace_s)
    if not _reaped(proc):
        family = _frozen_family(pid, family)     # torchrun starts each worker in a session of its own
    signal_group(pid, signal.SIGKILL)
    if isinstance(proc, int):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    elif not _reaped(proc):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    for child in family:
        with contextlib.suppress(psutil.Error):
            child.kill()
    wait_vanished(family, VANISH_S)
    if not isinstance(proc, int):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=reap_s)


def has_exited(proc: psutil.Process) -> bool:
    """True once ``proc`` has ended: no such process, or a zombie (it exited; its parent, or an init that is slow
    to reap orphans, has not collected it yet). ``psutil.wait_procs`` counts a zombie as alive."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:        # access denied: it exists and is not ours to judge
        return False


def pid_has_exited(pid: int) -> bool:
    """:func:`has_exited` for a pid (a pid that no longer exists has exited)."""
    try:
        return has_exited(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


def wait_vanished(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for every one of ``procs`` to exit (a zombie counts as exited, and nothing is
    reaped here); the ones still running at the end."""
    deadline = Deadline(timeout_s) if timeout_s and timeout_s > 0 else None
    alive = [p for p in procs if not has_exited(p)]
    while alive and deadline is not None and not deadline.expired:
        time.sleep(0.02)
        alive = [p for p in alive if not has_exited(p)]
    return alive


def _reaped(proc: subprocess.Popen | int) -> bool:
    """A Popen already waited for: its pid may be another process's now, so nothing is sent through it."""
    return not isinstance(proc, int) and proc.returncode is not None


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def _frozen_family(pid: int, known: list[psutil.Process]) -> list[psutil.Process]:
    """``known`` and every descendant of ``pid`` now, each stopped (SIGSTOP) as it is found: a stopped parent
    cannot start another child between this look and the kill, as a launcher mid-start would."""
    family = {p.pid: p for p in known}
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGSTOP)
    while new := [p for p in _descendants(pid) if p.pid not in family]:
        for child in new:
            family[child.pid] = child
            with contextlib.suppress(psutil.Error):
                child.suspend()
    return list(family.values())


def _running(proc: subprocess.Popen | int) -> bool:
    if isinstance(proc, int):
        with contextlib.suppress(psutil.Error):
            return psutil.Process(proc).status() != psutil.STATUS_ZOMBIE
        return False
    return proc.poll() is None


def _wait_gone(proc: subprocess.Popen | int, family: list[psutil.Process], grace_s: float) -> None:
    """Up to ``grace_s`` for the root to exit and its family to vanish (the root is reaped only through its Popen)."""
    deadline = Deadline(grace_s)
    if not isinstance(proc, int):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    else:
        while _running(proc) and not deadline.expired:      # polled: psutil's wait would reap a child of ours
            time.sleep(0.05)
    wait_vanished(family, deadline.remaining_s)
