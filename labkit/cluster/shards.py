"""Data each rank can see: every node holds its own shard on its own disk, and its ranks split it.

On a cluster the training set is often copied to the nodes' local disks in shards (one part per node), because
reading it over the network every epoch would load the link the gradients need. Each node's ranks then split the
node's shard between them: ``DistributedSampler(shard, num_replicas=LOCAL_WORLD_SIZE, rank=LOCAL_RANK)``, the
node-local view. Together the ranks see every sample exactly once per epoch.

What goes wrong when a node cannot see its shard (a copy that failed, a mount that is missing): its ranks crash
while the other nodes' ranks wait in the first collective. Here every rank checks its shard *before* any
collective, then all ranks exchange the outcome (``all_gather_object``), so a missing shard is the same one-line
error on every node, naming the node, its address and the path, and the job ends instead of hanging.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, TensorDataset

from labkit.cluster.nodes import EmulatedNodes
from labkit.cluster.rankside import job_params, place, report
from labkit.cluster.run import run_job
from labkit.core.validation import positive_int

SHARD_FILE = "shard.pt"
TARGET = "labkit.cluster.shards:read_node_shard"


class DataNotVisible(RuntimeError):
    """A node cannot read its shard: the one line says which node, where, and what to do."""


def write_node_shards(images: torch.Tensor, labels: torch.Tensor, folder: Path, nodes: int) -> list[Path]:
    """Split the data into ``nodes`` contiguous shards and save node k's as ``folder/node<k>/shard.pt``
    (its global sample indices too, so coverage can be checked); returns each node's folder."""
    positive_int(nodes, "nodes")
    if len(labels) < nodes:
        raise ValueError(f"{len(labels)} samples cannot give each of {nodes} nodes a shard")
    folders = []
    for node, idx in enumerate(torch.arange(len(labels)).tensor_split(nodes)):
        node_dir = Path(folder) / f"node{node}"
        node_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(node_dir, 0o777)                      # ranks in a user namespace read here too
        tmp = node_dir / (SHARD_FILE + ".tmp")
        torch.save({"indices": idx.clone(), "images": images[idx].clone(), "labels": labels[idx].clone()}, tmp)
        os.replace(tmp, node_dir / SHARD_FILE)
        folders.append(node_dir)
    return folders


def _check_shard(path: Path) -> str | None:
    """None when the shard is readable; else why not (one line)."""
    if not path.exists():
        return f"{path} does not exist"
    try:
        torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same lesson
        return f"{path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
    return None


def read_node_shard() -> dict:
    """Rank side: check this node's shard, agree with every rank on the outcome, then read this rank's part."""
    me = place()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    params = job_params()
    path = Path(params["data_dirs"][me.group_rank]) / SHARD_FILE
    problem = _check_shard(path)                       # before any collective: nothing waits on a crashed rank
    outcomes: list[Any] = [None] * me.world_size
    dist.all_gather_object(outcomes, (me.group_rank, me.node_addr, problem))
    missing = sorted({(node, addr, why) for node, addr, why in outcomes if why})
    if missing:
        lines = "; ".join(f"node {node} ({addr}) cannot see its data: {why}" for node, addr, why in missing)
        return report({"rank": me.rank, "error": lines + ": copy each node's shard to its disk (or mount the "
                                                          "shared filesystem on every node) and rerun"}, me.rank)
    shard = torch.load(path, weights_only=True)
    sampler = DistributedSampler(TensorDataset(shard["labels"]), num_replicas=me.local_world_size,
                                 rank=me.local_rank, shuffle=True, seed=int(params.get("seed", 0)))
    sampler.set_epoch(int(params.get("epoch", 0)))
    mine = list(sampler)                               # positions in this node's shard
    global_idx = shard["indices"][mine]
    labels = shard["labels"][mine]
    digest = hashlib.sha256(shard["images"][mine].numpy().tobytes()).hexdigest()[:16]
    return report({**me.as_dict(), "error": None, "shard_size": len(shard["labels"]), "indices": global_idx.tolist(),
                   "label_sum": int(labels.sum()), "images_sha256": digest}, me.rank)


def run_shard_lab(nodes: EmulatedNodes, data_dirs: Sequence[Path], procs_per_node: int,
                  timeout_s: float = 90.0) -> list[dict[str, Any]]:
    """Every rank reads its part of its node's shard; raises DataNotVisible (one line) if any node cannot."""
    job = run_job(nodes, TARGET, procs_per_node, {"data_dirs": [str(d) for d in data_dirs]}, timeout_s=timeout_s)
    errors = {r["error"] for r in job.results if r.get("error")}
    if errors:
        raise DataNotVisible(sorted(errors)[0])
    return job.results


def coverage(results: Sequence[dict[str, Any]], n_samples: int) -> dict[str, Any]:
    """Did the ranks see every sample exactly once, each rank only its own node's shard?"""
    seen = [i for r in results for i in r["indices"]]
    per_rank = {r["rank"]: len(r["indices"]) for r in results}
    shards = torch.arange(n_samples).tensor_split(len({r["group_rank"] for r in results}))
    own_node = all(set(r["indices"]) <= set(shards[r["group_rank"]].tolist()) for r in results)
    return {"samples": n_samples, "seen": len(seen), "distinct": len(set(seen)), "per rank": per_rank,
            "each exactly once": sorted(seen) == list(range(n_samples)), "only own node's shard": own_node}

