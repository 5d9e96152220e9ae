"""The MPI lane: detection, the runner's errors/timeout/cleanup, and the demos checked against exact answers."""
import numpy as np
import psutil
import pytest

from labkit.comm import mpi
from labkit.comm import mpi_demos
from labkit.comm.backend import check_world_size
from labkit.comm.mpi import MpiRankError, MpiTimeout, MpiUnavailableError, run_demo

INFO = mpi.mpi_info()
needs_mpi = pytest.mark.skipif(not INFO.available, reason=f"MPI lane not installed: {INFO.reason}")


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every test must leave no child process behind (no hung ranks, no orphaned mpiexec)."""
    yield
    children = psutil.Process().children(recursive=True)
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"processes left running: {[p.cmdline() for p in alive]}"


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


def test_demo_command_line_parsing():
    assert mpi_demos.parse_args(["ring", "length=10", "seed=3", "name=x"]) == ("ring", {"length": 10, "seed": 3,
                                                                                        "name": "x"})
    with pytest.raises(SystemExit, match="NAME is one of"):
        mpi_demos.parse_args(["bogus"])
    with pytest.raises(SystemExit, match="key=value"):
        mpi_demos.parse_args(["ring", "10"])


def test_mpiexec_command_per_flavor():
    hydra = mpi.MpiInfo(True, "MPICH", "5", "/x/mpiexec", "", "hydra")
    assert mpi.mpiexec_command(hydra, 3, True) == ["/x/mpiexec", "-n", "3", "-launcher", "fork"]
    ompi = mpi.MpiInfo(True, "Open MPI", "5", "/y/mpiexec", "", "openmpi")
    assert "--oversubscribe" in mpi.mpiexec_command(ompi, 3, True)
    assert "--oversubscribe" not in mpi.mpiexec_command(ompi, 2, False)


# ------------------------------------------------------------------------------------------ demos vs exact answers
@needs_mpi
def test_point_to_point_receiver_gets_the_buffer():
    run = run_demo("p2p", 2, oversubscribe=True, echo=False, length=6)
    sent, received = run.results[0]["before"], run.results[1]
    assert received["before"] == [0.0] * 6              # pre-allocated, empty
    assert received["after"] == sent == mpi_demos.demo_values(0, 6).tolist()
    assert received["source"] == 0
    assert "received 6 doubles from rank 0" in run.outputs[1]


@needs_mpi
def test_allreduce_sum_over_three_ranks():
    run = run_demo("allreduce", 3, oversubscribe=True, echo=False, length=5)
    exact = mpi.gather_arrays(run, "before").sum(axis=0)
    assert np.array_equal(exact, sum(mpi_demos.demo_values(r, 5) for r in range(3)))
    for result in run.results:
        assert np.array_equal(result["after"], exact)


@needs_mpi
@pytest.mark.parametrize("world_size, length, seed", [(3, 10, None), (3, 7, 1), (2, 1, 2), (2, 9, None)])
def test_ring_equals_allreduce_and_the_simulated_log(world_size, length, seed):
    run = run_demo("ring", world_size, oversubscribe=True, echo=False, length=length, seed=seed)
    exact = mpi.gather_arrays(run, "input").sum(axis=0)
    for result in run.results:
        ring, reference = np.asarray(result["ring"]), np.asarray(result["allreduce"])
        np.testing.assert_allclose(ring, reference, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ring, exact, rtol=1e-12, atol=1e-12)
        if seed is None:                                   # integer-valued data: every order gives the exact sum
            assert np.array_equal(ring, exact)
    log = mpi.ring_log(run)
    assert len(log) == world_size * 2 * (world_size - 1)
    assert log == mpi.simulated_ring_log(run)


@needs_mpi
def test_bench_reports_busbw_by_the_nccl_tests_definition():
    rows = mpi.mpi_allreduce_benchmark(2, [1024, 65536], iters=3, warmup=1, oversubscribe=True)
    assert [r.size_bytes for r in rows] == [1024, 65536]
    for r in rows:
        assert r.wrong == 0 and r.time_s > 0 and r.world_size == 2 and r.backend.startswith("MPI")
        assert r.algbw_gb_s == pytest.approx(r.size_bytes / r.time_s / 1e9)
        assert r.busbw_gb_s == pytest.approx(r.algbw_gb_s * 2 * (2 - 1) / 2)


def test_bench_rejects_bad_sizes():
    with pytest.raises(ValueError, match="whole float32 elements of 4 B each"):
        mpi.mpi_allreduce_benchmark(2, [6])


# ------------------------------------------------------------------------------------------ failures never hang
@needs_mpi
def test_a_rank_that_raises_brings_back_its_traceback():
    with pytest.raises(MpiRankError) as info:
        run_demo("raise_on_rank", 2, oversubscribe=True, echo=False, timeout_s=60, rank=1)
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


# ------------------------------------------------------------------------------------------ sync SGD under MPI
@needs_mpi
def test_sync_sgd_with_mpi_and_with_torch_distributed_under_mpiexec():
    from labkit.parallel.sync_sgd import train_single_process

    run = run_demo("torch_sgd", 2, oversubscribe=True, echo=False, timeout_s=180, steps=3, mpi_too=True)
    if INFO.mpiexec_flavor == "hydra":
        assert [r["launcher"] for r in run.results] == ["hydra", "hydra"]
        assert "PMI_RANK" in run.results[1]["variables"] and "RANK" not in run.results[1]["variables"]
    assert [(r["rank"], r["world_size"]) for r in run.results] == [(0, 2), (1, 2)]
    reference = train_single_process(2, steps=3)
    for key, tensor in reference.items():
        by_mpi = [np.asarray(r["mpi_weights"][key]) for r in run.results]
        by_gloo = [np.asarray(r["weights"][key]) for r in run.results]
        assert np.array_equal(by_mpi[0], by_mpi[1]) and np.array_equal(by_gloo[0], by_gloo[1])  # every rank
        assert np.array_equal(by_mpi[0], by_gloo[0])     # 2 ranks: a+b is the same bits in either library
        np.testing.assert_allclose(by_mpi[0], tensor.numpy(), rtol=0, atol=1e-6)


def test_mpi_too_needs_an_mpi_launcher(monkeypatch):
    for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="mpi_too=True needs an MPI launcher"):
        mpi_demos.torch_sgd(steps=1, mpi_too=True)


def test_torch_demo_finalizes_mpi_before_its_fast_exit(monkeypatch):
    """Open MPI fails a job whose ranks skip MPI_Finalize (the H100 run); os._exit would skip mpi4py's atexit."""
    import sys
    import types

    from labkit.comm import mpi_demos

    calls = []
    fake = types.SimpleNamespace(Is_initialized=lambda: True, Is_finalized=lambda: bool(calls),
                                 Finalize=lambda: calls.append("Finalize"))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
    mpi_demos._finalize_mpi_if_started()
    mpi_demos._finalize_mpi_if_started()          # idempotent: finalized once
    assert calls == ["Finalize"]
    monkeypatch.delitem(sys.modules, "mpi4py.MPI")
    mpi_demos._finalize_mpi_if_started()          # MPI never imported: nothing to do
    assert calls == ["Finalize"]
