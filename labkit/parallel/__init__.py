"""Parallelism, a folder per kind: each holds its hand-written version, torch's version, its cost model, its runs on
real ranks, its report and its exercises.

- ``data``: data parallelism — synchronous SGD from scratch (= DDP), when replicas pay (the cost model, measured
  scaling, the speed-up explorer), published scaling points (notebook 07).
- ``pipeline``: model and pipeline parallelism — a model split by layers, GPipe simulated and measured, torch's
  pipeline schedules on real ranks with their bubble and memory (notebooks 05, 05b).
- ``tensor``: tensor and sequence parallelism — Megatron's split by hand, torch's ``parallelize_module``, runs on real
  ranks, their cost, the comparison with DP and ZeRO-3 (notebook 13).
- ``context``: context parallelism — ring attention by hand and on real ranks, torch's ``context_parallel`` (notebook 14).
- ``experts``: expert parallelism — a mixture of experts by hand (router, top-k, capacity), split across ranks with
  two all-to-alls and checked against one process; what it sends; imbalance as a straggler, the load-balancing loss
  and the capacity factor (notebook 15).
- ``overlap``: communication hidden behind compute — hook-launched bucketed all-reduces equal to DDP, the exposed time
  predicted from an α-β fit and the backward, DDP's and FSDP2's overlap knobs (notebook 17).
- ``compose``: every parallelism on one mesh (``labkit.comm.mesh``) — one transformer as dp×tp, FSDP2×tp, dp×pp, tp×cp
  and pp×tp on 4 ranks, each equal to one process, bytes per axis against a formula (notebook 18).
- ``debug``: what goes wrong — hangs provoked and diagnosed, the flight recorder, silent drift, the multi-GPU pitfalls
  (notebooks 09, 09b).

A rank's device is labkit.comm.worker.rank_device.
"""

# the folders a learner uses (docs/api.md lists their modules, one line each)
__all__ = ["compose", "context", "data", "debug", "experts", "overlap", "pipeline", "tensor"]
