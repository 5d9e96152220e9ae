"""Overlap where communication is slow enough to matter: the same timed variants on two emulated nodes (notebook
12's network namespaces), one rank each, the link between them shaped by ``tc tbf``.

On gloo's loopback the all-reduce is CPU work (copies and sums) that competes with backward for the same two cores,
so a model that treats the link as a separate resource over-promises there. Over a shaped link the all-reduce mostly
waits for the wire, as it does between real nodes, and overlap can hide it. Run under ``labkit launch --nnodes 2``
(:func:`measure_on_link` builds the nodes, runs the job and tears the nodes down).
"""
from __future__ import annotations

import math
from dataclasses import asdict

from labkit.cluster.link_jobs import join_node_group, shape_own_link
from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.rankside import job_params, report
from labkit.cluster.run import run_job
from labkit.parallel.overlap.runs import OverlapConfig, time_variants

LINK_RATE_MBIT_S = 400.0     # about 50 MB/s: a 2 MiB all-reduce of 2 ranks takes ~40 ms, near the backward's time


def link_config() -> OverlapConfig:
    """The shaped link's model: 2.1 MB of fp32 gradients (8 linears of 256) and a batch of 1024, so backward (about
    15 ms on one quiet core) hides a good part of the all-reduce (about 50 ms at 400 Mbit/s) and the notebook stays
    inside its time budget."""
    return OverlapConfig(width=256, depth=8, batch=1024,
                         caps_bytes=(0, 64 << 10, 256 << 10, 1 << 20, math.inf), rounds=5)


def overlap_link_job() -> dict:
    """One rank's timed variants over the shaped link (its node's first rank re-shapes the link when asked)."""
    me = join_node_group()
    params = job_params()
    if params.get("rate_mbit_s"):
        shape_own_link(me, float(params["rate_mbit_s"]), params)
    result = time_variants(OverlapConfig(**_config_from_json(params["config"])))
    return report({**result, "local_rank": me.local_rank}, me.rank)


def _config_from_json(cfg: dict) -> dict:
    """JSON writes math.inf as Infinity and tuples as lists: the config's caps back as a tuple of floats."""
    return {**cfg, "caps_bytes": tuple(float(c) for c in cfg["caps_bytes"])}


def measure_on_link(cfg: OverlapConfig | None = None, rate_mbit_s: float = LINK_RATE_MBIT_S,
                    timeout_s: float = 120.0) -> list[dict]:
    """Build two emulated nodes with a ``rate_mbit_s`` link, run :func:`overlap_link_job` on one rank each, tear the
    nodes down (always); every rank's result, in rank order."""
    cfg = cfg or link_config()
    config = NodesConfig(nodes=2, rate_mbit_s=rate_mbit_s)
    with EmulatedNodes(config) as nodes:
        params = {"config": asdict(cfg), "burst_bytes": config.burst_bytes, "limit_bytes": config.limit_bytes}
        return run_job(nodes, "labkit.parallel.overlap.link_runs:overlap_link_job", nproc_per_node=1,
                       params=params, timeout_s=timeout_s).results
