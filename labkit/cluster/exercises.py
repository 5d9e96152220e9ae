"""Checked exercises for notebook 12: a rank's rendezvous environment on a multi-node job, and the bytes a node
sends over the slow link in a flat ring vs a two-level all-reduce.

The first reference is torchrun's numbering (node by node), checked on random layouts and on the places this
run's ranks reported; the second reads the kit's simulator (:func:`labkit.cluster.lab.simulated_link_bytes`).
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from labkit.cluster.lab import simulated_link_bytes
from labkit.core.exercises import Exercise, Mistake


# ------------------------------------------------------------------------------------ 12: torchrun's variables
def rank_env_reference(node_rank: int, local_rank: int, nnodes: int, nproc_per_node: int) -> dict[str, int]:
    """The variables torchrun sets for worker ``local_rank`` on node ``node_rank`` (ranks numbered node by node)."""
    return {"RANK": node_rank * nproc_per_node + local_rank, "WORLD_SIZE": nnodes * nproc_per_node,
            "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": nproc_per_node, "GROUP_RANK": node_rank}


def _layout_cases(seed: int = 12) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"node_rank": 1, "local_rank": 1, "nnodes": 2, "nproc_per_node": 2}]
    for _ in range(10):
        nnodes, per_node = rng.randint(2, 8), rng.randint(2, 8)
        cases.append({"node_rank": rng.randint(1, nnodes - 1), "local_rank": rng.randrange(per_node),
                      "nnodes": nnodes, "nproc_per_node": per_node})
    return cases


def rank_env_cases_for(results: Sequence[dict[str, Any]] | None, nnodes: int, nproc_per_node: int) -> list[dict]:
    """Every rank this run's launch reported (its node and local rank), then random layouts; a reported place
    that torchrun's numbering does not give raises, so the check is also a check of the launch."""
    cases = []
    for r in sorted(results or [], key=lambda r: r["rank"]):
        case = {"node_rank": r["group_rank"], "local_rank": r["local_rank"], "nnodes": nnodes,
                "nproc_per_node": nproc_per_node}
        reported = {"RANK": r["rank"], "WORLD_SIZE": r["world_size"], "LOCAL_RANK": r["local_rank"],
                    "LOCAL_WORLD_SIZE": r.get("local_world_size", nproc_per_node), "GROUP_RANK": r["group_rank"]}
        if rank_env_reference(**case) != reported:
            raise ValueError(f"rank {r['rank']} reported {reported}: not torchrun's node-by-node numbering")
        cases.append(case)
    return cases + _layout_cases()


RANK_ENV = Exercise(
    "rank_env", "the dict of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK torchrun gives worker "
    "`local_rank` on node `node_rank` of `nnodes` nodes with `nproc_per_node` workers each",
    rank_env_reference, _layout_cases,
    (Mistake("rank_is_local", lambda node_rank, local_rank, nnodes, nproc_per_node: dict(
        rank_env_reference(node_rank, local_rank, nnodes, nproc_per_node), RANK=local_rank),
             "RANK is global: the workers of the nodes before this one come first, node_rank x nproc_per_node + "
             "local_rank"),
     Mistake("world_is_node", lambda node_rank, local_rank, nnodes, nproc_per_node: dict(
         rank_env_reference(node_rank, local_rank, nnodes, nproc_per_node), WORLD_SIZE=nproc_per_node),
             "WORLD_SIZE counts every worker of every node: nnodes x nproc_per_node (LOCAL_WORLD_SIZE is one "
             "node's)")),
    "RANK = node_rank x nproc_per_node + local_rank; WORLD_SIZE = nnodes x nproc_per_node; GROUP_RANK = node_rank")


# ------------------------------------------------------------------------------------ 12: bytes across
def slow_link_bytes_reference(nbytes: int, nodes: int, per_node: int) -> dict[str, int]:
    """Bytes node 0 sends over the inter-node link in an all-reduce of ``nbytes`` per rank: the simulator's
    count for the flat ring (2(R-1)/R x nbytes) and the two-level one (2(N-1)/N x nbytes among node leaders)."""
    return simulated_link_bytes(nbytes, nodes, per_node)


def _link_cases(seed: int = 13) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(6):
        nodes, per_node = rng.randint(2, 4), rng.randint(2, 4)
        cases.append({"nbytes": 4 * nodes * nodes * per_node * rng.randint(1, 64), "nodes": nodes,
                      "per_node": per_node})
    return cases


def _whole_world(nbytes: int, nodes: int, per_node: int) -> dict[str, int]:
    world = nodes * per_node
    return {"flat": 2 * (world - 1) * nbytes // world, "hierarchical": 2 * (world - 1) * nbytes // world}


SLOW_LINK_BYTES = Exercise(
    "slow_link_bytes", "the bytes node 0 sends over the slow link in an all-reduce of `nbytes` per rank on `nodes` "
    "nodes of `per_node` ranks: {'flat': ring over all ranks, 'hierarchical': two-level}",
    slow_link_bytes_reference, _link_cases,
    (Mistake("two_level_as_flat", _whole_world,
             "in the two-level all-reduce only the N node leaders talk across the slow link, in a ring of N: "
             "2(N-1)/N x nbytes, not 2(R-1)/R"),
     Mistake("one_phase", lambda nbytes, nodes, per_node: {
         k: v // 2 for k, v in simulated_link_bytes(nbytes, nodes, per_node).items()},
             "a ring all-reduce is two phases (reduce-scatter, then all-gather): each sends (R-1)/R of the buffer")),
    "flat: one rank per node sends across, 2(R-1)/R x nbytes with R = nodes x per_node; two-level: the leader "
    "sends 2(N-1)/N x nbytes with N = nodes")
