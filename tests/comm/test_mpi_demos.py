"""The MPI demos checked against exact answers and the simulator, and the script plumbing every rank runs."""
import subprocess
import sys

import numpy as np
import pytest

from labkit.comm import mpi, mpi_demos
from labkit.comm.mpi import run_demo
from tests.mpi_lane import needs_mpi, no_leftover_processes  # noqa: F401 - an autouse fixture


# ------------------------------------------------------------------------------------------ plumbing
def test_demo_command_line_parsing():
    assert mpi_demos.parse_args(["ring", "length=10", "seed=3", "name=x"]) == ("ring", {"length": 10, "seed": 3,
                                                                                        "name": "x"})
    with pytest.raises(SystemExit, match="NAME is one of"):
        mpi_demos.parse_args(["bogus"])
    with pytest.raises(SystemExit, match="key=value"):
        mpi_demos.parse_args(["ring", "10"])


def test_every_demo_resolves_and_the_numpy_ones_start_without_torch():
    assert all(callable(mpi_demos.demo_function(name)) for name in mpi_demos.DEMOS)
    code = ("import sys; from labkit.comm import mpi_demos\n"
            "[mpi_demos.demo_function(n) for n, (kind, module) in mpi_demos.DEMOS.items() if module is None]\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


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
