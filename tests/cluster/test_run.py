"""A job across emulated nodes, as a cluster runs it: real torchrun per node, c10d rendezvous, clear failures."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.run import JobFailed, job_env, node_command, run_job


def _torch_leftovers() -> set[Path]:
    """What torchrun's agent leaves in the temporary folder when nothing points it elsewhere."""
    tmp = Path(tempfile.gettempdir())
    return set(tmp.glob("torchelastic_*")) | set(tmp.glob("pytorch-errorfile-*"))


def test_node_command_is_labkit_launch_with_the_nodes_flags():
    argv = node_command("a.b:c", 1, 2, 3, 30.0)
    assert argv[1:4] == ["-m", "labkit", "launch"]
    text = " ".join(argv)
    for part in ("--nnodes 2", "--node-rank 1", "--nproc-per-node 3", "--rdzv-endpoint 10.77.0.1:29400",
                 "--local-addr 10.77.0.2", "--timeout 30"):
        assert part in text


@pytest.fixture(scope="module")
def nodes(namespaces_here):
    with EmulatedNodes(NodesConfig(nodes=2, rate_mbit_s=500)) as built:
        yield built


def test_each_node_gets_a_temporary_folder_inside_the_jobs_folder(tmp_path):
    env = job_env(1, tmp_path, {})
    assert env["TMPDIR"] == str(tmp_path / "tmp-node1") and (tmp_path / "tmp-node1").is_dir()


def test_a_nodes_ranks_return_large_freed_blocks_unless_the_user_set_malloc_themselves(tmp_path, monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert job_env(0, tmp_path, {})["MALLOC_MMAP_THRESHOLD_"] == str(2**20)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert job_env(0, tmp_path, {})["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_every_rank_knows_its_place_and_its_node(nodes):
    before = _torch_leftovers()
    job = run_job(nodes, "labkit.cluster.link_jobs:identity", nproc_per_node=2, timeout_s=90)
    places = [(r["rank"], r["local_rank"], r["group_rank"], r["world_size"]) for r in job.results]
    assert places == [(0, 0, 0, 4), (1, 1, 0, 4), (2, 0, 1, 4), (3, 1, 1, 4)]
    assert all(r["owns_node_addr"] and r["all_reduce_sum"] == 10.0 for r in job.results)
    by_node = {r["group_rank"]: set() for r in job.results}
    for r in job.results:
        by_node[r["group_rank"]].add(r["node_addr"])
    assert sorted(len(a) for a in by_node.values()) == [1, 1] and by_node[0] != by_node[1]
    assert any("GROUP_RANK=1" in out for out in job.outputs)
    assert nodes.pids(0) == [] and nodes.pids(1) == []
    assert _torch_leftovers() - before == set(), "torchrun's folders outlived the job"


def test_a_bad_target_is_a_clear_error_naming_the_node(nodes):
    before = _torch_leftovers()
    with pytest.raises(JobFailed, match=r"node \d.* failed first, .* s in: its launcher exited with code"):
        run_job(nodes, "labkit.cluster.link_jobs:no_such_job", nproc_per_node=1, timeout_s=60)
    assert nodes.pids(0) == [] and nodes.pids(1) == []
    assert _torch_leftovers() - before == set(), "a failed job left torchrun's error files behind"


def test_a_job_that_outlives_its_timeout_is_killed_on_every_node(nodes):
    with pytest.raises(TimeoutError, match="did not finish within"):
        run_job(nodes, "labkit.cluster.link_jobs:identity", nproc_per_node=1, timeout_s=1)
    assert nodes.pids(0) == [] and nodes.pids(1) == []
