"""The MPI lane's runner: detection, bad input, errors, timeouts and cleanup, and the MPI benchmark's rows."""
import time
from pathlib import Path

import pytest

from labkit.comm import mpi
from labkit.comm.backend import check_world_size
from labkit.comm.leftovers import HYDRA_LEFTOVER
from labkit.comm.mpi import MpiRankError, MpiTimeout, MpiUnavailableError, run_demo
from labkit.core.clock import Deadline
from tests.mpi_lane import INFO, needs_mpi, no_leftover_processes  # noqa: F401 - an autouse fixture


# ------------------------------------------------------------------------------------------ detection
@needs_mpi
def test_mpi_info_names_the_library_and_launcher():
    assert INFO.implementation and INFO.version and INFO.mpiexec_path
    assert INFO.mpiexec_flavor in ("hydra", "openmpi", "unknown")
    assert INFO.implementation in str(INFO)


def test_mpi_info_without_mpi4py_says_how_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a))
    info = mpi.mpi_info()
    assert not info.available and 'pip install -e ".[mpi]"' in info.reason
    assert "not available" in str(info)


def test_missing_mpiexec_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(mpi, "find_mpiexec", lambda: None)
    if not mpi.mpi_info().reason.startswith("mpi4py is not installed"):
        assert "no mpiexec" in mpi.mpi_info().reason
    with pytest.raises(MpiUnavailableError, match=r'pip install -e "\.\[mpi\]"'):
        run_demo("allreduce", 2, oversubscribe=True)


# ------------------------------------------------------------------------------------------ bad input
def test_more_ranks_than_cores_needs_consent(monkeypatch):
    monkeypatch.setattr(mpi, "cpu_count", lambda: 2)
    with pytest.raises(ValueError, match="oversubscribe=True"):
        run_demo("allreduce", 3)
    assert check_world_size(3, mpi.rank_limit(oversubscribe=True)) == 3  # allowed when asked for


@pytest.mark.parametrize("kwargs, words", [
    (dict(demo="nope", world_size=2), "demo must be one of"),
    (dict(demo="ring", world_size=0), "world_size must be an integer >= 1"),
    (dict(demo="ring", world_size=2.0), "world_size must be an integer >= 1"),
    (dict(demo="ring", world_size=2, launcher="srun"), "launcher must be one of"),
    (dict(demo="ring", world_size=2, timeout_s=0), "timeout_s must be a number > 0"),
])
def test_bad_arguments_raise_value_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        run_demo(**kwargs)


def test_mpiexec_command_per_flavor():
    hydra = mpi.MpiInfo(True, "MPICH", "5", "/x/mpiexec", "", "hydra")
    assert mpi.mpiexec_command(hydra, 3, True) == ["/x/mpiexec", "-n", "3", "-launcher", "fork"]
    ompi = mpi.MpiInfo(True, "Open MPI", "5", "/y/mpiexec", "", "openmpi")
    assert "--oversubscribe" in mpi.mpiexec_command(ompi, 3, True)
    assert "--oversubscribe" not in mpi.mpiexec_command(ompi, 2, False)


@needs_mpi
def test_bench_reports_busbw_by_the_nccl_tests_definition():
    rows = mpi.mpi_allreduce_benchmark(2, [1024, 65536], iters=3, warmup=1, oversubscribe=True)
    assert [r.size_bytes for r in rows] == [1024, 65536]
    for r in rows:
        assert r.wrong == 0 and r.time_s > 0 and r.world_size == 2 and r.backend.startswith("MPI")
        assert r.algbw_gb_s == pytest.approx(r.size_bytes / r.time_s / 1e9)
        assert r.busbw_gb_s == pytest.approx(r.algbw_gb_s * 2 * (2 - 1) / 2)
        assert 0 < r.cpu_share <= 1      # the worst rank's measured share, for the verdict's load


def test_bench_rejects_bad_sizes():
    with pytest.raises(ValueError, match="whole float32 elements of 4 B each"):
        mpi.mpi_allreduce_benchmark(2, [6])


# ------------------------------------------------------------------------------------------ failures never hang
def left_after(before: set[Path], settle_s: float = 5.0) -> set[Path]:
    """Hydra files new since ``before`` that are still there after ``settle_s``: a live job's file (a test beside
    this one, a learner's job) goes when that job ends; one an aborted job left stays."""
    deadline = Deadline(settle_s)
    while (new := set(Path("/tmp").glob(HYDRA_LEFTOVER)) - before) and not deadline.expired:
        time.sleep(0.2)
    return new


@needs_mpi
def test_a_rank_that_raises_brings_back_its_traceback():
    before = set(Path("/tmp").glob(HYDRA_LEFTOVER))
    with pytest.raises(MpiRankError) as info:
        run_demo("raise_on_rank", 2, oversubscribe=True, echo=False, timeout_s=60, rank=1)
    assert not left_after(before), "MPI_Abort's Hydra file was left in /tmp"
    assert info.value.rank == 1
    assert "ValueError: rank 1 raises on purpose" in info.value.remote_traceback
    assert "traceback from rank 1" in str(info.value)


@needs_mpi
def test_a_rank_that_raises_outside_mpi_stops_its_waiting_peers():
    import time

    start = time.perf_counter()
    with pytest.raises(MpiRankError) as info:
        run_demo("raise_without_mpi", 2, oversubscribe=True, echo=False, timeout_s=100, rank=0)
    assert info.value.rank == 0 and "raises on purpose" in info.value.remote_traceback
    assert time.perf_counter() - start < 90, "the waiting rank was not stopped after the failure"


@needs_mpi
def test_timeout_kills_every_process():
    with pytest.raises(MpiTimeout, match="timeout_s=2"):
        run_demo("sleep", 2, oversubscribe=True, echo=False, timeout_s=2, seconds=120)
    # the autouse fixture then checks that no mpiexec, proxy or rank survived
