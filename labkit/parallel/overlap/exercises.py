"""Checked exercises for notebook 17 (communication hidden behind compute): the exposed communication of a step
from its buckets' ready times and all-reduce times, and DDP's bucket assignment; the overlapping all-reduce hook, judged
on live ranks, lives in :mod:`labkit.parallel.overlap.hook_exercise` (``OVERLAP_HOOK``, re-exported here).

References: the bucket schedule (:func:`labkit.parallel.overlap.exposed.schedule_buckets`) and the hand-written
sync's buckets (:func:`labkit.parallel.overlap.grad_sync.assign_buckets`). The first case of the exposed-time
exercise is the step this notebook just measured.
"""
from __future__ import annotations

import random
from typing import Mapping, Sequence

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.overlap.exposed import schedule_buckets
from labkit.parallel.overlap.grad_sync import assign_buckets
from labkit.parallel.overlap.hook_exercise import OVERLAP_HOOK  # noqa: F401 - the notebook's ex.OVERLAP_HOOK


def exposed_reference(ready_ms: list[float], comm_ms: list[float], backward_ms: float) -> float:
    """Exposed ms: one all-reduce at a time, each starting when its bucket is ready and the previous one is done;
    what runs past the end of backward."""
    return schedule_buckets(ready_ms, comm_ms, backward_ms, 0.0, 1.0).exposed_s


def _exposed_cases(seed: int = 57) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for k in range(8):
        backward = float(rng.randint(20, 120))
        n = rng.randint(2, 6)
        hidden = k % 3 == 2                             # every third step hides all its communication
        top = int(backward * (0.5 if hidden else 1.0))
        ready = sorted(float(rng.randint(1, top)) for _ in range(n))
        if not hidden:
            ready[-1] = backward                        # the last bucket is ready when backward ends
        comm = [float(rng.randint(1, 3 if hidden else 40)) for _ in range(n)]
        cases.append({"ready_ms": ready, "comm_ms": comm, "backward_ms": backward})
    return cases


def exposed_cases_for(step: Mapping, cases_seed: int = 57) -> list[dict]:
    """The measured step first (bucket launches as ready times, launch-to-finish as all-reduce times, in ms),
    then random cases."""
    buckets = sorted(step["buckets"], key=lambda b: b[2])
    first = {"ready_ms": [round(1e3 * b[2], 3) for b in buckets],
             "comm_ms": [round(1e3 * (b[3] - b[2]), 3) for b in buckets],
             "backward_ms": round(1e3 * step["backward_s"], 3)}
    return [first] + _exposed_cases(cases_seed)


def _no_overlap(ready_ms: list[float], comm_ms: list[float], backward_ms: float) -> float:
    return float(sum(comm_ms))


def _parallel_links(ready_ms: list[float], comm_ms: list[float], backward_ms: float) -> float:
    return max(0.0, max(r + c for r, c in zip(ready_ms, comm_ms)) - backward_ms)


def _no_clamp(ready_ms: list[float], comm_ms: list[float], backward_ms: float) -> float:
    free = 0.0
    for r, c in zip(ready_ms, comm_ms):
        free = max(r, free) + c
    return free - backward_ms


EXPOSED = Exercise(
    "exposed_comm_ms", "exposed communication of one step from its buckets' ready times and all-reduce times",
    exposed_reference, _exposed_cases,
    (Mistake("no_overlap", _no_overlap, "that is the rival 'no overlap': a bucket launched during backward runs while "
             "backward computes, so only what runs past the end of backward is exposed"),
     Mistake("parallel_links", _parallel_links, "the buckets share one link (one all-reduce at a time, in launch "
             "order): a bucket starts when it is ready AND the previous one has finished"),
     Mistake("no_clamp", _no_clamp, "when the last all-reduce ends before backward does, nothing is exposed: "
             "clamp at zero")),
    "walk the buckets in order: start = max(ready, previous end), end = start + comm; exposed = max(0, last end - "
    "backward)", rel_tol=1e-9)


def buckets_reference(param_bytes: list[int], bucket_cap_bytes: int) -> list[list[int]]:
    """Parameter indices per bucket, last parameter first; a bucket closes once it holds at least the cap."""
    return assign_buckets(param_bytes, bucket_cap_bytes)


def _bucket_cases(seed: int = 58) -> list[dict]:
    rng = random.Random(seed)
    return [{"param_bytes": [rng.choice([64, 256, 1024, 4096]) for _ in range(rng.randint(3, 9))],
             "bucket_cap_bytes": rng.choice([256, 1000, 2048, 5000])} for _ in range(8)]


def _forward_order(param_bytes: Sequence[int], bucket_cap_bytes: int) -> list[list[int]]:
    n = len(param_bytes)
    return [[n - 1 - i for i in bucket] for bucket in assign_buckets(list(reversed(param_bytes)), bucket_cap_bytes)]


def _cap_as_limit(param_bytes: Sequence[int], bucket_cap_bytes: int) -> list[list[int]]:
    buckets, current, held = [], [], 0
    for i in reversed(range(len(param_bytes))):
        if current and held + param_bytes[i] > bucket_cap_bytes:
            buckets.append(current)
            current, held = [], 0
        current.append(i)
        held += param_bytes[i]
    return buckets + ([current] if current else [])


BUCKETS = Exercise(
    "assign_buckets", "DDP-style buckets: parameter indices, filled in the order backward produces gradients",
    buckets_reference, _bucket_cases,
    (Mistake("forward_order", _forward_order, "backward produces the last layer's gradients first: fill buckets from "
             "the last parameter to the first, so the first bucket can launch while backward is still running"),
     Mistake("cap_as_limit", _cap_as_limit, "the cap is a threshold, not a limit: add the parameter, then close the "
             "bucket once it holds at least the cap (a parameter larger than the cap gets a bucket of its own)")),
    "go from the last parameter to the first; add each to the open bucket; close it once its bytes reach the cap",
    rel_tol=0.0)
