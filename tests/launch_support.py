"""Shared by the launcher's tests: a parent process that launch()es sleeping ranks, to kill in different ways."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import psutil

from labkit.comm.stop import stop_group
from labkit.core.clock import Deadline

REPO = Path(__file__).resolve().parents[1]
SERVER_SLEEP_ENV = "LABKIT_TEST_SERVER_SLEEP_S"   # a rank forkserver importing this module sleeps that long first
MARKER_ENV = "LABKIT_TEST_MARKER_DIR"             # where mark_then_sleep() leaves one file per rank that ran

if os.environ.get(SERVER_SLEEP_ENV) and "serve_forks" in " ".join(getattr(sys, "orig_argv", [])):
    Path(os.environ[MARKER_ENV], "server").write_text("importing")    # torch is in; the ranks are forked next
    time.sleep(float(os.environ[SERVER_SLEEP_ENV]))   # the forkserver's start-up (its imports), made wide enough to hit

# a stand-in for an init that is slow to reap orphans: a child subreaper (prctl 36) that runs the parent, reports its
# exit code on stdout, and never reaps the orphans re-parented to it, which stay zombies until it exits
LAZY_REAPER = ("import ctypes, os, subprocess, sys, time; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
               "p = subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True); print(p.wait(), flush=True); "
               "time.sleep(600)")


def sleep_forever() -> None:
    """What the ranks run: nothing, for ten minutes (a stand-in for a hang)."""
    time.sleep(600)


def mark_then_sleep() -> None:
    """Leave a file named after this rank in $LABKIT_TEST_MARKER_DIR (proof that the rank ran), then sleep."""
    Path(os.environ[MARKER_ENV], os.environ["RANK"]).write_text("ran")
    time.sleep(600)


class ReapedParent:
    """The launching parent run under :data:`LAZY_REAPER`: signalled by pid, its exit code read from the reaper."""

    def __init__(self, reaper: subprocess.Popen) -> None:
        assert reaper.stdout is not None
        self.reaper = reaper
        self.pid = int(reaper.stdout.readline())

    def send_signal(self, sig: int) -> None:
        """Signal the parent."""
        os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        """The parent's exit code, once the reaper has reaped it."""
        assert self.reaper.stdout is not None
        return int(self.reaper.stdout.readline())


def start_parent(tmp_path: Path, start_method: str = "fresh", target: str = "tests.launch_support:sleep_forever",
                 lazy_reaper: bool = False, **popen) -> subprocess.Popen:
    """Start a Python process that launch()es 2 ranks running ``target`` (under :data:`LAZY_REAPER` if asked:
    then the returned Popen is the reaper's, and the parent is its only child)."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from labkit.comm.launch import launch
        launch({target!r}, 2, timeout_s=300, start_method={start_method!r})
    """))
    command = [sys.executable, str(script)]
    if lazy_reaper:
        command = [sys.executable, "-c", LAZY_REAPER, *command]
        popen["stdout"] = subprocess.PIPE
    return subprocess.Popen(command, cwd=REPO, start_new_session=True, **popen)


@contextlib.contextmanager
def parent_of_sleeping_ranks(tmp_path: Path, start_method: str = "fresh", lazy_reaper: bool = False,
                             **popen) -> Iterator[tuple[subprocess.Popen | ReapedParent, list[psutil.Process]]]:
    """Start a Python process that launch()es 2 sleeping ranks; yield it and its descendants (once both ranks run).

    The descendants are the 2 ranks, plus their forkserver with ``start_method="forkserver"``. With
    ``lazy_reaper`` the parent runs under :data:`LAZY_REAPER`: what it leaves behind when it dies stays a zombie.
    Whatever the test does, the parent and everything it started are killed on the way out.
    """
    root = start_parent(tmp_path, start_method, lazy_reaper=lazy_reaper, **popen)
    expected = 2 + (start_method == "forkserver")
    try:
        parent = ReapedParent(root) if lazy_reaper else root
        deadline, kids = Deadline(60), []
        while not deadline.expired and len(kids) < expected:
            time.sleep(0.2)
            kids = psutil.Process(parent.pid).children(recursive=True)
        yield parent, kids
    finally:
        stop_group(root)
        if root.stdout is not None:
            root.stdout.close()


def rank_one_is_killed() -> int:
    """Rank 1 dies by SIGKILL (as the OOM killer does); rank 0 returns its rank."""
    import os
    import signal

    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    dist.barrier()                       # the group is fully connected before the kill
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def returns_then_lingers() -> int:
    """Return at once, then keep the process alive 60 s in a non-daemon thread (a slow teardown)."""
    import os
    import threading

    threading.Thread(target=time.sleep, args=(60,)).start()
    return int(os.environ["RANK"])


def rank_zero_returns_the_others_hang() -> str:
    """Rank 0 returns at once; every other rank hangs (a timeout or Ctrl-C must keep rank 0's result)."""
    import os

    if os.environ["RANK"] != "0":
        time.sleep(600)
    return "rank 0 finished"


def rank_zero_returns_then_rank_one_is_killed() -> str:
    """Rank 0 returns at once; rank 1 dies by SIGKILL 3 s later (rank 0's result must not be lost with it)."""
    import os
    import signal

    if os.environ["RANK"] == "1":
        time.sleep(3)
        os.kill(os.getpid(), signal.SIGKILL)
    return "rank 0 finished"


_HOLDS_A_ZOMBIE = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'pass']); "
                   "print(p.pid, flush=True); time.sleep(60)")      # never waits: its exited child stays a zombie


@contextlib.contextmanager
def a_zombie() -> Iterator[psutil.Process]:
    """A process that has exited and is not reaped (its parent sleeps), as a rank left behind a dead launcher."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDS_A_ZOMBIE], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        zombie = psutil.Process(int(holder.stdout.readline()))
        deadline = Deadline(30)
        while zombie.status() != psutil.STATUS_ZOMBIE and not deadline.expired:
            time.sleep(0.02)
        yield zombie
    finally:
        stop_group(holder)
        holder.stdout.close()


def rank_one_freezes() -> None:
    """Rank 1 stops itself with SIGSTOP (state T, as a frozen node process); every other rank sleeps."""
    import signal

    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)
