"""Checked exercises for notebook 12: a rank's rendezvous environment on a multi-node job, and the bytes a node
sends over the slow link in a flat ring vs a two-level all-reduce.

The first reference is torchrun's numbering (node by node, the nodes in the order c10d rendezvous gives them, not
``--node-rank``'s), checked on random layouts and on the places this run's ranks reported; the second reads the
kit's simulator (:func:`labkit.cluster.lab.simulated_link_bytes`).
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from labkit.cluster.lab import simulated_link_bytes
from labkit.core.exercises import Exercise, Mistake


# ------------------------------------------------------------------------------------ 12: torchrun's variables
# torch/distributed/run.py: "node_rank is only used for static rdzv_backend. It will be ignored for rdzv_backend=c10d."
NODE_RANK_IGNORED = "node_rank is only used for static rdzv_backend"


def rank_env_reference(group_rank: int, local_rank: int, nnodes: int, nproc_per_node: int) -> dict[str, int]:
    """The variables torchrun sets for worker ``local_rank`` on the node the rendezvous numbered ``group_rank``
    (ranks numbered node by node, in the rendezvous' order of the nodes)."""
    return {"RANK": group_rank * nproc_per_node + local_rank, "WORLD_SIZE": nnodes * nproc_per_node,
            "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": nproc_per_node, "GROUP_RANK": group_rank}


def rendezvous_group_ranks(addresses: Sequence[str]) -> dict[str, int]:
    """Each node address -> the GROUP_RANK c10d rendezvous gives it: the nodes sorted by their descriptor (address
    as a string, then the agent's pid), whatever ``--node-rank`` said (torch's dynamic_rendezvous.py,
    ``_mark_rendezvous_complete``: ``for rank, node in enumerate(sorted(state.participants))``)."""
    return {addr: rank for rank, addr in enumerate(sorted(set(addresses)))}


def node_rank_ignored(outputs: Sequence[str]) -> list[str]:
    """torchrun's own warning, where a node's output has it, that --node-rank was ignored ([] where none)."""
    return [line.strip() for out in outputs for line in out.splitlines() if NODE_RANK_IGNORED in line]


def _layout_cases(seed: int = 12) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"group_rank": 1, "local_rank": 1, "nnodes": 2, "nproc_per_node": 2}]
    for _ in range(10):
        nnodes, per_node = rng.randint(2, 8), rng.randint(2, 8)
        cases.append({"group_rank": rng.randint(1, nnodes - 1), "local_rank": rng.randrange(per_node),
                      "nnodes": nnodes, "nproc_per_node": per_node})
    return cases


def rank_env_cases_for(results: Sequence[dict[str, Any]] | None, nnodes: int, nproc_per_node: int) -> list[dict]:
    """Every rank this run's launch reported (its group and local rank), then random layouts. A reported place that
    torchrun's numbering does not give, or a GROUP_RANK that is not the rendezvous' order of the node addresses,
    raises: the check is also a check of what torchrun did."""
    cases, results = [], sorted(results or [], key=lambda r: r["rank"])
    order = rendezvous_group_ranks([r["node_addr"] for r in results if "node_addr" in r])
    for r in results:
        case = {"group_rank": r["group_rank"], "local_rank": r["local_rank"], "nnodes": nnodes,
                "nproc_per_node": nproc_per_node}
        reported = {"RANK": r["rank"], "WORLD_SIZE": r["world_size"], "LOCAL_RANK": r["local_rank"],
                    "LOCAL_WORLD_SIZE": r.get("local_world_size", nproc_per_node), "GROUP_RANK": r["group_rank"]}
        if rank_env_reference(**case) != reported:
            raise ValueError(f"rank {r['rank']} reported {reported}: not torchrun's node-by-node numbering")
        if "node_addr" in r and order[r["node_addr"]] != r["group_rank"]:
            raise ValueError(f"rank {r['rank']} on {r['node_addr']} has GROUP_RANK {r['group_rank']}, not "
                             f"{order[r['node_addr']]}: not c10d rendezvous' order of the node addresses")
        cases.append(case)
    return cases + _layout_cases()


RANK_ENV = Exercise(
    "rank_env", "the dict of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK torchrun gives worker "
    "`local_rank` on the node that c10d rendezvous numbered `group_rank`, of `nnodes` nodes with `nproc_per_node` "
    "workers each",
    rank_env_reference, _layout_cases,
    (Mistake("rank_is_local", lambda group_rank, local_rank, nnodes, nproc_per_node: dict(
        rank_env_reference(group_rank, local_rank, nnodes, nproc_per_node), RANK=local_rank),
             "RANK is global: the workers of the nodes the rendezvous put before this one come first, group_rank x "
             "nproc_per_node + local_rank"),
     Mistake("world_is_node", lambda group_rank, local_rank, nnodes, nproc_per_node: dict(
         rank_env_reference(group_rank, local_rank, nnodes, nproc_per_node), WORLD_SIZE=nproc_per_node),
             "WORLD_SIZE counts every worker of every node: nnodes x nproc_per_node (LOCAL_WORLD_SIZE is one "
             "node's)")),
    "RANK = group_rank x nproc_per_node + local_rank; WORLD_SIZE = nnodes x nproc_per_node; GROUP_RANK = "
    "group_rank, the node's place in the rendezvous (c10d sorts the nodes by address; --node-rank is ignored)")


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
