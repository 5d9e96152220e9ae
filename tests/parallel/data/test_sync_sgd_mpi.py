"""The torch demos of the MPI lane: the same synchronous SGD with MPI collectives and with torch.distributed."""
import numpy as np
import pytest

from labkit.parallel.data import sync_sgd_mpi
from labkit.comm.mpi import run_demo
from tests.mpi_lane import INFO, needs_mpi, no_leftover_processes  # noqa: F401 - an autouse fixture


# ------------------------------------------------------------------------------------------ sync SGD under MPI
@needs_mpi
def test_sync_sgd_with_mpi_and_with_torch_distributed_under_mpiexec():
    from labkit.training.reference import train_single_process

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
        sync_sgd_mpi.torch_sgd(steps=1, mpi_too=True)
