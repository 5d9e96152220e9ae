"""Checked exercises for notebook 09b: read flight records and name the rank; find where a training loop hangs.

References: :func:`labkit.parallel.debug.flight_recorder.diagnose` (the kit's reader) and the step counts of
:func:`uneven_shards_loop`, the hanging loop itself, which ``labkit diagnose`` and the notebook run for real.
"""
from __future__ import annotations

import math
import random

import torch
import torch.distributed as dist

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.debug.flight_recorder import Entry, diagnose

OPS = ("all_reduce", "broadcast", "all_gather", "barrier")


# ------------------------------------------------------------------------------------ name the rank
def stuck_rank_reference(records: dict) -> int:
    """The rank the flight records single out: at the first sequence id where the ranks differ, the one that
    entered nothing or another call (op or sizes) than the others (``flight_recorder.diagnose``); -1 if the
    records agree."""
    entries = {int(r): [Entry(e["seq"], e["op"], tuple(map(tuple, e["sizes"])), "") for e in es]
               for r, es in records.items()}
    culprits = diagnose(entries).culprits
    return culprits[0] if culprits else -1


def _records_case(rng: random.Random) -> dict:
    """Seeded records of W ranks: the same calls, except one rank stops early or calls another op or size."""
    world, n = rng.randint(3, 8), rng.randint(3, 12)
    calls = [(rng.choice(OPS[:3]), [[rng.choice([1, 64, 1024])]]) for _ in range(n)]
    culprit, at, kind = rng.randrange(world), rng.randint(1, n), rng.choice(["missing", "op", "sizes"])
    records = {}
    for rank in range(world):
        es = [{"seq": i + 1, "op": op, "sizes": sizes} for i, (op, sizes) in enumerate(calls)]
        if rank == culprit:
            if kind == "missing":
                es = es[:at - 1]
            elif kind == "op":
                es[at - 1] = {**es[at - 1], "op": "barrier", "sizes": []}
            else:
                es[at - 1] = {**es[at - 1], "sizes": [[es[at - 1]["sizes"][0][0] + 1]]}
            if kind != "missing":
                es = es[:at]                          # it waits in that wrong call from then on
        else:
            es = es[:at]                              # the others wait in call ``at``
        records[rank] = es
    return {"records": records}


def _records_cases(seed: int = 41) -> list[dict]:
    rng = random.Random(seed)
    return [_records_case(rng) for _ in range(12)]


def records_cases_for(records: dict) -> list[dict]:
    """The notebook's live records first, then the seeded ones."""
    return [{"records": records}] + _records_cases()


def _fewest_entries(records: dict) -> int:
    return min(records, key=lambda r: (len(records[r]), r))


def _ops_only(records: dict) -> int:
    stripped = {r: [{**e, "sizes": []} for e in es] for r, es in records.items()}
    return stuck_rank_reference(stripped)


STUCK_RANK = Exercise(
    "stuck_rank", "name the rank from every rank's flight record: {rank: [{'seq', 'op', 'sizes'}, ...]}",
    stuck_rank_reference, _records_cases,
    (Mistake("fewest_entries", _fewest_entries,
             "the rank with the fewest entries is the culprit only when it skipped a call; a rank that called "
             "ANOTHER collective (a barrier, a different size) has as many entries: compare op and sizes too"),
     Mistake("ops_only", _ops_only,
             "compare the sizes as well as the op: an all_reduce of 65 floats against one of 64 never matches")),
    "walk the sequence ids from the first: at the first one where the ranks' (op, sizes) differ, the rank that "
    "disagrees with the others (or has no entry) is the one to look at")


# ------------------------------------------------------------------------------------ the loop that hangs
def uneven_shards_loop(num_samples: int = 10, batch_size: int = 1) -> int:
    """A training loop with a bug: each rank takes samples rank, rank+W, ... (no padding) in batches, and
    all-reduces a gradient per batch; returns the steps it ran. ``labkit diagnose`` runs it for real."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = list(range(rank, num_samples, world))
    steps = 0
    for start in range(0, len(mine), batch_size):
        grad = torch.full((4,), float(len(mine[start:start + batch_size])))
        dist.all_reduce(grad)                      # every rank must make this call the same number of times
        steps += 1
    return steps


def hang_point_reference(num_samples: int, batch_size: int, world_size: int) -> tuple | None:
    """Where :func:`uneven_shards_loop` hangs: (the step index no rank can finish, the ranks waiting in it), or
    None when every rank runs the same number of steps."""
    return _hang_at([math.ceil(len(range(r, num_samples, world_size)) / batch_size) for r in range(world_size)])


def _hang_at(steps: list[int]) -> tuple | None:
    """(fewest steps, the ranks with more) from each rank's step count; None if they are all equal."""
    if len(set(steps)) == 1:
        return None
    low = min(steps)
    return low, tuple(r for r, s in enumerate(steps) if s > low)


def _loop_cases(seed: int = 42) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"num_samples": 10, "batch_size": 1, "world_size": 3}, {"num_samples": 12, "batch_size": 2,
                                                                     "world_size": 3}]
    for _ in range(12):
        cases.append({"num_samples": rng.randint(4, 60), "batch_size": rng.randint(1, 8),
                      "world_size": rng.randint(2, 8)})
    return cases


HANG_POINT = Exercise(
    "hang_point", "where uneven_shards_loop hangs: (step index, ranks left waiting in it), or None",
    hang_point_reference, _loop_cases,
    (Mistake("floor_steps", lambda num_samples, batch_size, world_size: _hang_at(
        [len(range(r, num_samples, world_size)) // batch_size for r in range(world_size)]),
             "the loop's last batch may be short, so a rank runs ceil(samples / batch) steps; ranks whose sample "
             "counts differ by one can differ by a step"),
     Mistake("waiting_is_short_rank", lambda num_samples, batch_size, world_size: (
         lambda s: None if len(set(s)) == 1 else (min(s), tuple(r for r, x in enumerate(s) if x == min(s))))(
         [math.ceil(len(range(r, num_samples, world_size)) / batch_size) for r in range(world_size)]),
             "the ranks with FEWER steps finish and leave; the ones with more steps are left waiting")),
    "count each rank's samples (range(rank, N, W)), its steps ceil(samples / batch); the first step the "
    "shortest rank never reaches is where the others wait")
