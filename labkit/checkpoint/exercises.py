"""Checked exercises for notebook 16: the rows of a parameter each rank holds after resharding, and how often to
save; the DCP save and load, judged on live ranks, lives in :mod:`labkit.checkpoint.save_exercise` (``SAVE_AND_LOAD``,
re-exported here).

References: ``torch.chunk`` along dim 0, which is how FSDP2 (and DTensor's ``Shard(0)``) cuts a parameter; the
notebook and the tests also hold the reference against the shards a real resume on 3 ranks loaded
(:func:`measured_shard_cases`). The interval is Young's (``labkit.checkpoint.interval``; Young 1974).
"""
from __future__ import annotations

import random

from labkit.checkpoint.interval import cluster_mtbf_s, young_interval_s
from labkit.checkpoint.save_exercise import SAVE_AND_LOAD  # noqa: F401 - the notebook's ex.SAVE_AND_LOAD
from labkit.core.exercises import Exercise, Mistake


def shard_rows_reference(rows: int, world_size: int, rank: int) -> list[int]:
    """[start, stop) of the rows rank ``rank`` holds when ``rows`` are cut over ``world_size`` ranks the way
    ``torch.chunk`` cuts them: ceil(rows / world_size) each, the last ranks short (or empty)."""
    chunk = -(-rows // world_size)
    start = min(rank * chunk, rows)
    return [start, min(start + chunk, rows)]


def _array_split(rows: int, world_size: int, rank: int) -> list[int]:
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return [start, start + base + (1 if rank < extra else 0)]


def _floor_last_takes_rest(rows: int, world_size: int, rank: int) -> list[int]:
    chunk = rows // world_size
    return [rank * chunk, rows if rank == world_size - 1 else (rank + 1) * chunk]


def _shard_cases(seed: int = 57) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"rows": 8, "world_size": 3, "rank": 2}, {"rows": 10, "world_size": 4, "rank": 3}]
    for _ in range(10):
        world_size = rng.choice([2, 3, 4, 6, 8])
        cases.append({"rows": rng.randint(1, 100), "world_size": world_size, "rank": rng.randrange(world_size)})
    return cases


def measured_shard_cases(resume_results: list[dict], full_rows: dict[str, int]) -> list[dict]:
    """One case per (parameter, rank) of a real resume, with the rows DTensor actually gave that rank:
    {"rows", "world_size", "rank", "measured_rows"} (drop ``measured_rows`` before checking an answer)."""
    world_size = len(resume_results)
    return [{"rows": full_rows[name], "world_size": world_size, "rank": r["rank"],
             "measured_rows": int(shard.shape[0]) if shard.dim() else 0}
            for r in resume_results for name, shard in r["shards"].items()]


SHARD_ROWS = Exercise(
    "shard_rows", "the [start, stop) rows of a parameter's dim 0 that one rank holds after resharding to M ranks",
    shard_rows_reference, _shard_cases,
    (Mistake("array_split", _array_split, "FSDP2 cuts like torch.chunk, not numpy.array_split: every rank gets "
             "ceil(rows / M) rows and the last ranks come up short (8 rows on 3 ranks: 3, 3, 2; 10 on 4: 3, 3, 3, 1)"),
     Mistake("floor_last_takes_rest", _floor_last_takes_rest, "the chunk is ceil(rows / M), not floor: the remainder "
             "is not piled on the last rank")),
    "chunk = ceil(rows / M); rank r holds rows min(r * chunk, rows) up to min((r + 1) * chunk, rows)",
    rel_tol=0.0)


def interval_reference(save_cost_s: float, node_mtbf_s: float, nodes: int) -> float:
    """Young's optimum seconds between saves for a job on ``nodes`` nodes, each failing every ``node_mtbf_s``."""
    return young_interval_s(save_cost_s, cluster_mtbf_s(node_mtbf_s, nodes))


def _interval_cases(seed: int = 58) -> list[dict]:
    rng = random.Random(seed)
    return [{"save_cost_s": round(rng.uniform(1, 600), 1), "node_mtbf_s": float(rng.choice([1, 5, 30, 365]) * 86400),
             "nodes": rng.choice([1, 8, 64, 512, 4096])} for _ in range(8)]


def interval_cases_for(save_cost_s: float) -> list[dict]:
    """The save time this notebook just measured, on a 512-node job whose nodes fail once in 5 years, then more."""
    return [{"save_cost_s": save_cost_s, "node_mtbf_s": 5 * 365 * 86400.0, "nodes": 512}] + _interval_cases()


BEST_INTERVAL = Exercise(
    "checkpoint_interval", "the seconds between checkpoints that lose the least time (Young 1974), for a job of "
    "`nodes` nodes each failing on average every `node_mtbf_s` seconds",
    interval_reference, _interval_cases,
    (Mistake("node_mtbf", lambda save_cost_s, node_mtbf_s, nodes: young_interval_s(save_cost_s, node_mtbf_s),
             "the job stops when any node fails: its mean time between failures is node_mtbf_s / nodes"),
     Mistake("no_two", lambda save_cost_s, node_mtbf_s, nodes: (save_cost_s * node_mtbf_s / nodes) ** 0.5,
             "a failure loses half an interval on average: waste = C/tau + tau/(2M), least at sqrt(2 C M)")),
    "waste per second = C / tau + tau / (2 M) with M = node_mtbf_s / nodes; set its derivative to zero")
