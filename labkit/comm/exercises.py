"""Checked exercises for notebooks 06 and 06b: one ring step, a ring's bytes, bus bandwidth, ring neighbours.

The references read the kit's all-reduce simulator (:mod:`labkit.comm.collectives`: its message log) and the
nccl-tests bandwidth correction in :mod:`labkit.comm.bench`, on random sizes and world sizes.
"""
from __future__ import annotations

import random

import numpy as np

from labkit.comm.bench import bandwidths_gb_s
from labkit.comm.collectives import allreduce
from labkit.core.exercises import Exercise, Mistake


def _ring_steps(world_size: int, length: int) -> list:
    arrays = [np.ones(length, dtype=np.float32) for _ in range(world_size)]
    return allreduce(arrays, algorithm="ring").steps


# ------------------------------------------------------------------------------------ 06: one ring step
def ring_chunks_reference(rank: int, step: int, world_size: int) -> tuple[int, int]:
    """(chunk ``rank`` sends, chunk it receives) at reduce-scatter step ``step``, read from the simulator's log
    (Patarasuk & Yuan 2009; Thakur et al. 2005)."""
    steps = [s for s in _ring_steps(world_size, 3 * world_size + 1) if s.phase == "reduce-scatter"]
    first = min(s.step for s in steps)
    at = [s for s in steps if s.step == first + step]
    sent = next(s.chunk for s in at if s.sender == rank)
    received = next(s.chunk for s in at if s.receiver == rank)
    return sent, received


def _ring_cases(seed: int = 6) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(12):
        r = rng.randint(2, 9)
        cases.append({"rank": rng.randrange(r), "step": rng.randrange(r - 1), "world_size": r})
    return cases + [{"rank": 0, "step": 1, "world_size": 4}]


RING_CHUNKS = Exercise(
    "ring_chunks", "in step s of the ring's reduce-scatter, which chunk rank i sends to i+1 and which it receives",
    ring_chunks_reference, _ring_cases,
    (Mistake("plus_step", lambda rank, step, world_size: ((rank + step) % world_size, (rank + step - 1)
                                                          % world_size),
             "chunks travel with the data to the right, so the chunk index falls by one each step: rank i sends "
             "chunk (i - s) mod R"),
     Mistake("off_by_one", lambda rank, step, world_size: ((rank - step - 1) % world_size, (rank - step - 2)
                                                           % world_size),
             "off by one: at step 0 every rank sends its OWN chunk (chunk i), and receives its left neighbour's"),
     Mistake("swapped", lambda rank, step, world_size: ((rank - step - 1) % world_size, (rank - step)
                                                        % world_size),
             "send and receive are swapped: you receive from the left neighbour (i-1), who sends chunk (i-1-s)"),
     Mistake("no_modulo", lambda rank, step, world_size: (rank - step, rank - step - 1),
             "chunk numbers wrap around the ring: take them modulo the world size")),
    "rank i sends chunk (i - s) mod R and receives chunk (i - s - 1) mod R")


# ------------------------------------------------------------------------------------ 06: a ring's bytes
def ring_bytes_sent_reference(nbytes: int, world_size: int) -> int:
    """Bytes each worker sends in a ring all-reduce of ``nbytes``: the simulator's count, 2(R-1)/R x N."""
    arrays = [np.zeros(nbytes // 4, dtype=np.float32) for _ in range(world_size)]
    return int(allreduce(arrays, algorithm="ring").bytes_sent.max())


def _bytes_cases(seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(8):
        r = rng.randint(2, 12)
        cases.append({"nbytes": 4 * r * rng.randint(1, 4096), "world_size": r})
    return cases


RING_BYTES = Exercise(
    "ring_bytes_sent", "bytes one worker sends in a ring all-reduce of N bytes on R workers",
    ring_bytes_sent_reference, _bytes_cases,
    (Mistake("one_phase", lambda nbytes, world_size: (world_size - 1) * nbytes // world_size,
             "a ring all-reduce has TWO phases, reduce-scatter and all-gather, each sending (R-1) chunks of N/R"),
     Mistake("whole_array_per_step", lambda nbytes, world_size: 2 * (world_size - 1) * nbytes,
             "each step sends one chunk, N/R bytes, not the whole array"),
     Mistake("twice_n", lambda nbytes, world_size: 2 * nbytes,
             "close, but each phase has R-1 steps (not R): 2 (R-1)/R x N")),
    "2 phases x (R-1) steps x N/R bytes per step")


# ------------------------------------------------------------------------------------ 06b: bus bandwidth
def busbw_reference(size_bytes: int, time_s: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth in GB/s: algbw x 2(n-1)/n (``comm.bench.bandwidths_gb_s``)."""
    return bandwidths_gb_s(size_bytes, time_s, world_size)[1]


def _busbw_cases(seed: int = 8) -> list[dict]:
    rng = random.Random(seed)
    return [{"size_bytes": 2 ** rng.randint(10, 30), "time_s": rng.uniform(1e-5, 0.5), "world_size": rng.randint(2, 16)}
            for _ in range(8)]


BUSBW = Exercise(
    "busbw_gb_s", "bus bandwidth (GB/s, 1e9 B) of an all-reduce of S bytes per rank that took t seconds on n ranks",
    busbw_reference, _busbw_cases,
    (Mistake("algbw", lambda size_bytes, time_s, world_size: size_bytes / time_s / 1e9,
             "that is algbw (S/t); busbw corrects it by 2(n-1)/n, the share each rank's link really carries "
             "(nccl-tests, doc/PERFORMANCE.md)"),
     Mistake("one_phase", lambda size_bytes, time_s, world_size: size_bytes / time_s / 1e9 * (world_size - 1)
             / world_size, "an all-reduce is a reduce-scatter plus an all-gather: the factor is 2(n-1)/n"),
     Mistake("gib", lambda size_bytes, time_s, world_size: size_bytes / time_s / 2 ** 30 * 2 * (world_size - 1)
             / world_size, "GB here is 1e9 bytes, as nccl-tests prints, not 2**30")),
    "busbw = S / t / 1e9 x 2(n-1)/n")


# ------------------------------------------------------------------------------------ 06b: ring neighbours
def ring_neighbours_reference(rank: int, size: int) -> tuple[int, int]:
    """(rank to send to, rank to receive from) in a ring: the simulator's first step's sender -> receiver."""
    first = [s for s in _ring_steps(size, 2 * size) if s.phase == "reduce-scatter"]
    send_to = next(s.receiver for s in first if s.sender == rank)
    recv_from = next(s.sender for s in first if s.receiver == rank)
    return send_to, recv_from


def _neighbour_cases(seed: int = 9) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"rank": 0, "size": 4}, {"rank": 3, "size": 4}]
    for _ in range(8):
        n = rng.randint(2, 10)
        cases.append({"rank": rng.randrange(n), "size": n})
    return cases


RING_NEIGHBOURS = Exercise(
    "ring_neighbours", "for MPI Send/Recv around a ring: the rank this one sends to, and the rank it receives from",
    ring_neighbours_reference, _neighbour_cases,
    (Mistake("no_wrap", lambda rank, size: (rank + 1, rank - 1),
             "the ring closes: the last rank sends to rank 0 and rank 0 receives from the last (use % size)"),
     Mistake("swapped", lambda rank, size: ((rank - 1) % size, (rank + 1) % size),
             "data flows to the right: send to rank+1, receive from rank-1")),
    "send to (rank + 1) % size, receive from (rank - 1) % size")
