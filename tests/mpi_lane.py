"""Shared by the MPI lane's tests: is MPI here (skip the runs if not), and no test may leave a process behind."""
from __future__ import annotations

import psutil
import pytest

from labkit.comm import mpi
from labkit.comm.stop import wait_vanished

INFO = mpi.mpi_info()
needs_mpi = pytest.mark.skipif(not INFO.available, reason=f"MPI lane not installed: {INFO.reason}")


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every test must leave no child process behind (no hung ranks, no orphaned mpiexec)."""
    yield
    children = psutil.Process().children(recursive=True)
    alive = wait_vanished(children, 5)          # a grandchild that exited but is not reaped yet counts as gone
    assert not alive, f"processes left running: {[p.cmdline() for p in alive]}"
