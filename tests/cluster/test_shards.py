"""Data each rank can see: node-local shards split by DistributedSampler, and a node without its shard."""
from __future__ import annotations

import time

import pytest
import torch

from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.shards import DataNotVisible, coverage, run_shard_lab, write_node_shards

N = 96


def _data(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8, generator=g), torch.arange(n) % 10


def test_shards_are_contiguous_parts_saved_for_weights_only_loading(tmp_path):
    images, labels = _data()
    folders = write_node_shards(images, labels, tmp_path, 3)
    shards = [torch.load(f / "shard.pt", weights_only=True) for f in folders]
    assert [s["indices"].tolist() for s in shards] == [list(range(0, 32)), list(range(32, 64)), list(range(64, 96))]
    assert torch.equal(shards[1]["images"], images[32:64]) and not list(tmp_path.rglob("*.tmp"))
    with pytest.raises(ValueError, match="cannot give each of 4 nodes a shard"):
        write_node_shards(images[:3], labels[:3], tmp_path, 4)


def test_coverage_tells_exactly_once_from_overlaps_and_strays():
    ranks = [{"rank": r, "group_rank": r // 2, "indices": list(range(r * 3, r * 3 + 3))} for r in range(4)]
    assert coverage(ranks, 12)["each exactly once"] and coverage(ranks, 12)["only own node's shard"]
    overlap = [dict(ranks[0]), dict(ranks[1], indices=[0, 1, 2])] + ranks[2:]
    assert not coverage(overlap, 12)["each exactly once"]
    stray = [dict(ranks[0], indices=[9, 10, 11])] + ranks[1:3] + [dict(ranks[3], indices=[0, 1, 2])]
    assert not coverage(stray, 12)["only own node's shard"]


@pytest.fixture(scope="module")
def two_nodes(namespaces_here):
    with EmulatedNodes(NodesConfig(nodes=2, rate_mbit_s=None)) as nodes:
        yield nodes


def test_each_rank_reads_its_part_of_its_own_nodes_shard(two_nodes, tmp_path):
    images, labels = _data()
    folders = write_node_shards(images, labels, tmp_path, 2)
    results = run_shard_lab(two_nodes, folders, procs_per_node=2)
    cov = coverage(results, N)
    assert cov["each exactly once"] and cov["only own node's shard"], cov
    assert sum(r["label_sum"] for r in results) == int(labels.sum())


def test_a_node_without_its_shard_is_one_clear_error_on_every_rank_not_a_hang(two_nodes, tmp_path):
    images, labels = _data()
    folders = write_node_shards(images, labels, tmp_path, 2)
    (folders[1] / "shard.pt").unlink()
    start = time.monotonic()
    with pytest.raises(DataNotVisible, match=r"node 1 \(10\.77\.0\.2\) cannot see its data: .*shard.pt does not "
                                             r"exist: copy each node's shard"):
        run_shard_lab(two_nodes, folders, procs_per_node=2, timeout_s=60)
    assert time.monotonic() - start < 45
    assert two_nodes.pids(0) == [] and two_nodes.pids(1) == []
