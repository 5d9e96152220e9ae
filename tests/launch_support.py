"""Shared by the launcher's tests: a parent process that launch()es sleeping ranks, to kill in different ways."""
from __future__ import annotations

import contextlib
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


def sleep_forever() -> None:
    """What the ranks run: nothing, for ten minutes (a stand-in for a hang)."""
    time.sleep(600)


@contextlib.contextmanager
def parent_of_sleeping_ranks(tmp_path: Path, start_method: str = "fresh",
                             **popen) -> Iterator[tuple[subprocess.Popen, list[psutil.Process]]]:
    """Start a Python process that launch()es 2 sleeping ranks; yield it and its descendants (once both ranks run).

    The descendants are the 2 ranks, plus their forkserver with ``start_method="forkserver"``. Whatever the test
    does, the parent and everything it started are killed on the way out.
    """
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from labkit.comm.launch import launch
        launch("tests.launch_support:sleep_forever", 2, timeout_s=300, start_method={start_method!r})
    """))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO, **popen)
    expected = 2 + (start_method == "forkserver")
    try:
        deadline, kids = Deadline(60), []
        while not deadline.expired and len(kids) < expected:
            time.sleep(0.2)
            kids = psutil.Process(parent.pid).children(recursive=True)
        yield parent, kids
    finally:
        stop_group(parent)


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
