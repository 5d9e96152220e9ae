"""The MPI lane across emulated nodes: Hydra without ssh, the sum exact, the bytes over the shaped link."""
from __future__ import annotations

import subprocess

import pytest

from labkit.cluster.mpi_nodes import (SHARED_KERNEL_ENV, mpiexec_args, node_exec_script, run_demo_on_nodes,
                                      shaped_link_rate)
from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.comm.mpi import mpi_info


@pytest.fixture(scope="module")
def nodes(namespaces_here):
    info = mpi_info()
    if not info.available or info.mpiexec_flavor != "hydra":
        pytest.skip(f"needs MPICH's Hydra mpiexec: {info}")
    with EmulatedNodes(NodesConfig(nodes=2, rate_mbit_s=200)) as lab:
        yield lab


def test_node_exec_runs_a_command_on_the_node_that_owns_the_address(nodes, tmp_path):
    script = node_exec_script(nodes, tmp_path)
    out = subprocess.run([str(script), "-x", "10.77.0.2", "cat /sys/class/net/eth0/address; ip -br addr show eth0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "10.77.0.2/24" in out.stdout, out
    bad = subprocess.run([str(script), "10.77.0.9", "true"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 255 and "no emulated node has address 10.77.0.9" in bad.stderr
    args = mpiexec_args(nodes, script, ranks_per_node=2)
    assert args[args.index("-hosts") + 1] == "10.77.0.1,10.77.0.2" and args[args.index("-n") + 1] == "4"


def test_allreduce_across_the_nodes_is_exact_and_its_bytes_cross_the_shaped_link(nodes):
    run = run_demo_on_nodes(nodes, "allreduce")
    assert [r["after"] for r in run.results] == [[12.0, 14.0, 16.0, 18.0]] * 2
    before = nodes.link_bytes()[0]["tx_bytes"]
    bench = run_demo_on_nodes(nodes, "bench", sizes_bytes=[2**20, 2**22], iters=3, warmup=1)
    sent = nodes.link_bytes()[0]["tx_bytes"] - before
    rows = bench.results[0]["rows"]
    assert all(r["wrong"] == 0 for r in rows)
    assert sent >= 5 * 2**22          # (1 + 1 + 3) calls of 4 MiB and of 1 MiB, each sending about n across
    # tbf shapes frames to 200 Mbit/s = 25 MB/s: never more (shared memory would be far faster), and on a busy
    # machine a slower CPU only lowers it
    rate_bytes_s = shaped_link_rate(rows, sent, warmup=1, iters=3)
    assert 0.3 * 25e6 < rate_bytes_s < 1.15 * 25e6, (rate_bytes_s, sent, rows)
    assert nodes.pids(0) == [] and nodes.pids(1) == []
    assert SHARED_KERNEL_ENV["FI_PROVIDER"] == "tcp"


def test_shaped_link_rate_counts_every_call_the_bench_made():
    rows = [{"size_bytes": 2**20, "time_s": 0.05}, {"size_bytes": 2**22, "time_s": 0.2}]
    sent = int(1.05 * 5 * (2**20 + 2**22))           # 1 checked + 1 warm-up + 3 timed calls per size, 5% headers
    assert shaped_link_rate(rows, sent, warmup=1, iters=3) == pytest.approx(1.05 * 2**22 / 0.2)
    # a slow 1 MiB call would have bent the slope between the two sizes; it does not touch this rate
    assert shaped_link_rate([{**rows[0], "time_s": 0.1}, rows[1]], sent, warmup=1, iters=3) == pytest.approx(
        1.05 * 2**22 / 0.2)
    with pytest.raises(ValueError, match="did the bench run on the nodes"):
        shaped_link_rate(rows, 0, warmup=1, iters=3)
