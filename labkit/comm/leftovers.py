"""What MPI libraries leave behind when a job does not end normally, found and removed (torch-free, numpy-free).

MPICH's Hydra writes its topology to ``/tmp/hydra_hwloc_xmlfile_*`` (hard-coded, not ``TMPDIR``) and deletes it
when the job ends normally, but not after ``MPI_Abort``; MPICH's ch4 shared-memory layer creates a 2 MiB
``/dev/shm/mpich_shm_*`` segment per job and leaves it when the job is killed (a timeout, Ctrl-C). Both are
removed here, only those that appeared while the job ran, only this user's, and a segment only once no live
process maps it.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

from labkit.core.clock import Deadline

HYDRA_LEFTOVER = "hydra_hwloc_xmlfile_*"  # MPICH's Hydra writes its topology to /tmp (hard-coded, not TMPDIR)
SHM_LEFTOVER = "mpich_shm_*"              # MPICH's shared-memory segment (2 MiB per job); a killed job leaves it
SHM_LEFTOVERS = (SHM_LEFTOVER, "ucx_shm_posix_*")   # and UCX's (MPICH's ucx netmod), seen beside it
SETTLE_S = 3.0   # a killed rank can map its segment a moment after the kill returns (a busy machine): wait this long


@contextlib.contextmanager
def removing_mpi_leftovers(folder: Path = Path("/tmp"), shm: Path = Path("/dev/shm")) -> Iterator[None]:
    """Delete what MPICH leaves behind when a job does not end normally (MPI_Abort, a timeout, a kill): the Hydra
    topology files in ``folder`` and the ``mpich_shm_*`` (and UCX) segments in ``shm`` that appeared while the
    block ran, this user's only, and a segment only once no live process maps it (another job's stays)."""
    def found() -> set[Path]:
        return set(folder.glob(HYDRA_LEFTOVER)).union(*(shm.glob(pattern) for pattern in SHM_LEFTOVERS))

    before = found()
    try:
        yield
    finally:
        new = {p for p in found() - before if _owned(p)}
        deadline = Deadline(SETTLE_S)
        while new:
            mapped = _mapped_paths() if any(p.parent == shm for p in new) else set()
            for path in [p for p in new if str(p) not in mapped]:
                with contextlib.suppress(OSError):
                    path.unlink()
                new.discard(path)
            if not new or deadline.expired:     # what a live process still maps after SETTLE_S is another job's
                break
            time.sleep(0.1)


def _owned(path: Path) -> bool:
    """This user's file (a shared /dev/shm holds other users' segments too)."""
    with contextlib.suppress(OSError):
        return path.stat().st_uid == os.getuid()
    return False


def _mapped_paths() -> set[str]:
    """Every file some process maps now (from /proc/PID/maps; others' processes that cannot be read are skipped)."""
    paths = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                fields = line.split(maxsplit=5)      # address perms offset dev inode [path]
                if len(fields) == 6:
                    paths.add(fields[5].removesuffix(" (deleted)"))
    return paths
