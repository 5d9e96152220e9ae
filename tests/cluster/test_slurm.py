"""The Slurm script and the two-host recipe: the right directives, rendezvous from SLURM_*, valid bash."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from labkit.cluster.slurm import ClusterJob, slurm_script, two_host_recipe

JOB = ClusterJob("labkit.cluster.link_jobs:identity", nodes=4, procs_per_node=8, gpus_per_node=8)


def test_script_asks_for_one_task_per_node_and_meets_at_the_first_host():
    script = slurm_script(JOB)
    assert script.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --time=00:30:00", 'scontrol show hostnames "$SLURM_JOB_NODELIST"'):
        assert line in script
    srun = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    assert len(srun) == 1
    assert "--nnodes 4 --node-rank $SLURM_NODEID --nproc-per-node 8 --rdzv-endpoint $HEAD:29400" in srun[0]
    assert "--rdzv-id $SLURM_JOB_ID" in srun[0] and srun[0].count("'") == 2   # expanded on each node, not here
    assert "export HEAD=" in script                       # the tasks' shells must see it
    assert "--gpus-per-node" not in slurm_script(ClusterJob("a.b:c"))
    assert "--fork-workers" not in script and "--fork-workers a.b:c" in slurm_script(ClusterJob("a.b:c", fork_workers=True))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n"], input=slurm_script(JOB), capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr


def test_two_host_recipe_differs_only_in_the_node_rank():
    recipe = two_host_recipe(ClusterJob("a.b:c", nodes=2, procs_per_node=2), "gpu-a")
    commands = [ln for ln in recipe.splitlines() if ln.startswith("labkit launch")]
    assert len(commands) == 2
    assert commands[0].replace("--node-rank 0", "--node-rank 1") == commands[1]
    assert "--rdzv-endpoint gpu-a:29400" in commands[0]


@pytest.mark.parametrize("kwargs, match", [({"target": "nocolon"}, "package.module:function"),
                                           ({"target": "a:b", "nodes": 0}, "nodes must be"),
                                           ({"target": "a:b", "time_limit": "1h"}, "HH:MM:SS"),
                                           ({"target": "a:b", "job_name": "x y"}, "job_name")])
def test_bad_jobs_get_one_clear_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClusterJob(**kwargs)
    with pytest.raises(ValueError, match="head_host"):
        two_host_recipe(ClusterJob("a:b"), "bad host")
