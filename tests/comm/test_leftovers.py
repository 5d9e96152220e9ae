"""What MPI leaves behind after a job that did not end normally: Hydra's /tmp files and MPICH's /dev/shm segments."""
import contextlib
import mmap
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from labkit.comm.leftovers import SHM_LEFTOVERS, removing_mpi_leftovers
from tests.mpi_lane import needs_mpi, no_leftover_processes  # noqa: F401 - an autouse fixture


def test_hydra_leftovers_made_inside_the_block_go_and_older_ones_stay(tmp_path):
    older = tmp_path / "hydra_hwloc_xmlfile_old"
    older.write_text("x")
    with removing_mpi_leftovers(tmp_path):
        (tmp_path / "hydra_hwloc_xmlfile_new").write_text("x")
        (tmp_path / "other_file").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hydra_hwloc_xmlfile_old", "other_file"]



def test_shm_segments_made_inside_the_block_go_unless_a_live_process_maps_them(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "mpich_shm_old_0").write_bytes(b"x" * 4096)
    with removing_mpi_leftovers(tmp_path, shm):
        (shm / "mpich_shm_new_0").write_bytes(b"x" * 4096)
        (shm / "ucx_shm_posix_1234").write_bytes(b"x" * 4096)
        in_use = shm / "mpich_shm_busy_0"
        in_use.write_bytes(b"x" * 4096)
        with open(in_use, "r+b") as f:
            mapping = mmap.mmap(f.fileno(), 4096)
    try:
        assert sorted(p.name for p in shm.iterdir()) == ["mpich_shm_busy_0", "mpich_shm_old_0"]
    finally:
        mapping.close()


def test_a_segment_still_mapped_by_a_rank_that_is_ending_goes_once_it_ends(tmp_path):
    """A killed rank can map its segment a moment after the kill returns; the segment goes once the rank is gone."""
    shm = tmp_path / "shm"
    shm.mkdir()
    segment = shm / "ucx_shm_posix_99"
    with removing_mpi_leftovers(tmp_path, shm):
        segment.write_bytes(b"x" * 4096)
        ending = subprocess.Popen([sys.executable, "-c", "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); "
                                   "m = mmap.mmap(f.fileno(), 4096); print('mapped', flush=True); time.sleep(0.5)",
                                   str(segment)], stdout=subprocess.PIPE, text=True)
        assert ending.stdout.readline().strip() == "mapped"
    assert ending.wait(timeout=10) == 0 and not segment.exists()


def _who_maps(paths: set[Path]) -> dict[str, list[str]]:
    """For a failure message: which live processes map each path."""
    who: dict[str, list[str]] = {str(p): [] for p in paths}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            for m in proc.memory_maps(grouped=True):
                if m.path in who:
                    who[m.path].append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'] or [])[:120]}")
    return who


@needs_mpi
def test_a_killed_mpi_demo_leaves_no_shared_memory_segment():
    """The probe: every killed MPI demo left a 2 MiB mpich_shm_* segment (two per run of notebook 06b)."""
    from labkit.comm.mpi import MpiTimeout, run_demo

    def segments() -> set[Path]:
        return set().union(*(Path("/dev/shm").glob(pattern) for pattern in SHM_LEFTOVERS))

    before = segments()
    with pytest.raises(MpiTimeout):
        run_demo("sleep", 2, oversubscribe=True, echo=False, timeout_s=3, seconds=60)
    left = segments() - before
    assert left == set(), f"left behind: {left}; mapped by {_who_maps(left)}"
