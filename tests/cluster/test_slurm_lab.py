"""The kit's Slurm script under a real Slurm: slurmctld and one slurmd per emulated node (Debian's slurm-wlm).

Skipped, with the reason, where Slurm is not installed or this is not root; ``.ci/run`` installs slurm-wlm so CI
runs it.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.slurm import ClusterJob, slurm_script
from labkit.cluster.slurm_lab import SlurmOnNodes, slurm_conf, slurm_support


def test_conf_names_every_node_with_its_address(tmp_path):
    conf = slurm_conf(tmp_path, 3, 2)
    assert "SlurmctldHost=node0(10.77.0.1)" in conf
    assert "NodeName=node2 NodeAddr=10.77.0.3 CPUs=2" in conf
    assert "PartitionName=lab Nodes=node0,node1,node2 " in conf and f"socket={tmp_path / 'munge.sock'}" in conf


@pytest.fixture(scope="module")
def slurm(namespaces_here):
    ok, why = slurm_support()
    if not ok:
        pytest.skip(why)
    with EmulatedNodes(NodesConfig(nodes=2, rate_mbit_s=None)) as nodes, SlurmOnNodes(nodes) as cluster:
        yield cluster


def test_the_kits_batch_script_runs_torchrun_on_every_node_of_a_real_slurm(slurm):
    """sbatch -> one srun task per node -> labkit launch (torchrun, c10d rendezvous at the first host) -> ranks
    numbered node by node, each on its own node's address, one all-reduce across the nodes."""
    job = ClusterJob("labkit.cluster.link_jobs:identity", nodes=2, procs_per_node=2, time_limit="00:05:00",
                     env=(("GLOO_SOCKET_IFNAME", "eth0"),), fork_workers=True)
    with tempfile.TemporaryDirectory() as results:
        Path(results).chmod(0o777)
        done = slurm.sbatch(slurm_script(job), timeout_s=150,
                            extra_env={"LABKIT_RESULT_DIR": results, "OMP_NUM_THREADS": "1"})
        reports = [json.loads(p.read_text()) for p in sorted(Path(results).glob("rank*.json"))]
    assert done.exit_code == 0, done.output[-3000:]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3], done.output[-2000:]
    for r in reports:
        assert r["group_rank"] == r["rank"] // 2 and r["world_size"] == 4
        assert r["all_reduce_sum"] == 10.0                         # 1 + 2 + 3 + 4, across both nodes
        assert r["node_addr"] == f"node{r['group_rank']}" and r["owns_node_addr"]   # the node's own host name
    assert "RANK=2 LOCAL_RANK=0 GROUP_RANK=1 WORLD_SIZE=4" in done.output


def test_a_failing_job_is_reported_by_its_exit_code(slurm):
    done = slurm.sbatch("#!/bin/bash\n#SBATCH --nodes=2\nsrun --nodes=2 bash -c 'exit $SLURM_NODEID'\n", timeout_s=60)
    assert done.exit_code != 0
