"""Notebook 12's measurements as calls: run the link lab on the nodes, fit each link, predict and judge.

One job per link speed (``link_lab`` on every rank) gives the ping-pong sweeps and the interleaved flat vs
two-level all-reduce rounds; this module turns them into tables: alpha and beta per link against the shaping
setting, and per size the measured times, bytes over the slow link (counted by the node's ``eth0``) and what the
two-tier alpha-beta model (:mod:`labkit.comm.two_tier`) predicts from the *fitted* links. A timing verdict is
drawn only where the model's margin is clear (``MARGIN``); elsewhere the row says "too close to call".
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np

from labkit.cluster.linkfit import (LinkFit, allreduce_summary, expected_payload_bytes_s, fit_links, link_spread,
                                    rates_by_repeat)
from labkit.cluster.nodes import SUBNET, EmulatedNodes, NodesConfig
from labkit.cluster.rankside import rate_key
from labkit.cluster.run import JobResult, run_job
from labkit.comm.collectives import allreduce
from labkit.comm.two_tier import hierarchical_allreduce, inter_node_bytes, predicted_times_s
from labkit.core.env import Mode, get_mode
from labkit.core.results import ResultStream, keep_finished
from labkit.core.rundirs import run_path
from labkit.core.validation import positive_int, positive_ints
from labkit.core.verdict import Load, Rival, Verdict, judge_agreement

MARGIN = 1.3        # the model must predict one algorithm this much faster before the clock is asked to agree
NOISY_SPREAD = 1.5  # paired ratios that move more than this between rounds: too busy a machine to compare links
BITS_PER_BYTE = 8   # the link rate's rival: a rate in Mbit/s read as MB/s is 8x the shaped payload rate


@dataclass(frozen=True)
class LabConfig:
    """The node lab's sizes: nodes, ranks per node, two link speeds (Mbit/s), message sizes, repeats."""

    nodes: int = 2
    procs_per_node: int = 2
    rates_mbit_s: tuple[float, ...] = (200.0, 800.0)
    allreduce_sizes: tuple[int, ...] = (512 * 1024, 4 * 1024 * 1024)
    repeats: int = 5
    rounds: int = 3
    timeout_s: float = 150.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        positive_int(self.nodes, "nodes")
        positive_int(self.procs_per_node, "procs_per_node")
        if self.nodes < 2:
            raise ValueError(f"nodes must be >= 2 to have a link between nodes, got {self.nodes}")
        if not self.rates_mbit_s or any(not r > 0 for r in self.rates_mbit_s):
            raise ValueError(f"rates_mbit_s must be link speeds > 0 in Mbit/s, got {self.rates_mbit_s}")
        positive_ints(self.allreduce_sizes, "allreduce_sizes")
        positive_int(self.repeats, "repeats")
        positive_int(self.rounds, "rounds")

    @classmethod
    def for_mode(cls, mode: Mode | None = None) -> "LabConfig":
        """Fast (CPU, 2 cores): 2 nodes x 2 ranks; full: 2 x 4 ranks, more sizes and rounds."""
        if (mode or get_mode()).fast:
            return cls()
        return cls(procs_per_node=4, allreduce_sizes=(512 * 1024, 4 * 1024**2, 16 * 1024**2), repeats=9, rounds=5)

    def params(self, nodes: NodesConfig) -> dict[str, Any]:
        """The job parameters ``link_lab`` reads (the shaping's burst and queue from the nodes' config)."""
        return {"allreduce_sizes": list(self.allreduce_sizes), "repeats": self.repeats, "rounds": self.rounds,
                "rates_mbit_s": list(self.rates_mbit_s), "burst_bytes": nodes.burst_bytes,
                "limit_bytes": nodes.limit_bytes, "sgd": {"rounds": self.rounds}, **self.extra}


def run_link_lab(nodes: EmulatedNodes, config: LabConfig, results: str | Path | None = None) -> JobResult:
    """Run the link lab on every rank of every node: one job, each link speed in turn (the nodes re-shape).

    Each speed every rank finished is saved to ``results`` (JSON lines; default runs/node-lab/links.jsonl); a
    timeout, Ctrl-C or SIGTERM keeps those and raises StoppedEarly saying how many of the speeds finished.
    """
    stream = ResultStream(Path(results) if results else run_path("node-lab", "links.jsonl"),
                          len(config.rates_mbit_s), "link speeds")
    world_size = nodes.config.nodes * config.procs_per_node
    with tempfile.TemporaryDirectory(prefix="labkit-nodes-") as tmp, keep_finished(stream, lambda rows: None):
        try:
            return run_job(nodes, "labkit.cluster.link_jobs:link_lab", config.procs_per_node,
                           config.params(nodes.config), timeout_s=config.timeout_s, result_dir=Path(tmp))
        finally:        # also on a stop: the ranks report after each speed, and those reports outlive them here
            for row in finished_speeds(Path(tmp), world_size, config.rates_mbit_s):
                stream.add(row)


def finished_speeds(result_dir: Path, world_size: int, rates_mbit_s: Sequence[float]) -> list[dict]:
    """The link speeds, in order, that every rank reported to ``result_dir``: one row per speed, all ranks in it."""
    paths = [result_dir / f"rank{rank}.json" for rank in range(world_size)]
    reports = [json.loads(path.read_text()) for path in paths if path.exists()]
    rows = []
    for rate in rates_mbit_s:
        if len(reports) < world_size or any(rate_key(rate) not in r["by_rate"] for r in reports):
            break
        ranks = [{**{k: v for k, v in r.items() if k != "by_rate"}, **r["by_rate"][rate_key(rate)]} for r in reports]
        rows.append({"rate_mbit_s": rate, "ranks": ranks})
    return rows


def at_rate(results: Sequence[dict], rate_mbit_s: float) -> list[dict]:
    """Each rank's results at one link speed, with its place (the per-speed tables read these)."""
    return [{**r, **r["by_rate"][rate_key(rate_mbit_s)]} for r in results]


def places_table(results: Sequence[dict]) -> list[dict[str, Any]]:
    """One row per rank: RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, its node's address, whether its stack owns it."""
    return [{"RANK": r["rank"], "LOCAL_RANK": r["local_rank"], "GROUP_RANK": r["group_rank"],
             "WORLD_SIZE": r["world_size"], "node address": r["node_addr"], "address is this stack's":
             r["owns_node_addr"]} for r in results]


def fit_table(results: Sequence[dict], rate_mbit_s: float) -> tuple[dict[str, LinkFit], list[dict[str, Any]]]:
    """Each link's fitted alpha and beta (from rank 0's ping-pongs) beside what the shaping allows."""
    fits = fit_links(results[0]["ping_pong_s"])
    expected = expected_payload_bytes_s(rate_mbit_s)
    rows = []
    for link, fit in fits.items():
        rows.append({"link": link, "alpha (us)": fit.alpha_s * 1e6, "beta (ns/B)": fit.beta_s_per_byte * 1e9,
                     "1/beta (MB/s)": fit.bandwidth_bytes_s / 1e6, "R^2": fit.r_squared,
                     "shaped to (MB/s of payload)": expected / 1e6 if link == "inter" else float("nan")})
    return fits, rows


def link_rate_verdict(claim: str, results: Sequence[dict], rate_mbit_s: float, tolerance: float = 0.15) -> Verdict:
    """Is the fitted inter-node 1/beta the shaped payload rate? Judged with the load the ping-pong ran under: the
    CPU share each rank of the pair got during the sweep and how far the repeats' own rates disagree; a miss the
    repeats' own rates straddle is INCONCLUSIVE."""
    ranks = at_rate(results, rate_mbit_s)
    fitted = fit_links(ranks[0]["ping_pong_s"])["inter"].bandwidth_bytes_s
    shares = {f"rank {r['rank']}": r["ping_pong_cpu_share"]["inter"]
              for r in ranks if "inter" in r.get("ping_pong_cpu_share", {})}
    sweep = ranks[0]["ping_pong_s"]["inter"]
    load = Load.measured(shares, spread=link_spread(sweep))
    shaped = expected_payload_bytes_s(rate_mbit_s)
    return judge_agreement(claim, 1.0, fitted / shaped, tolerance=tolerance, load=load,
                           unit=" x the shaped payload rate",
                           by_round=[(1.0, rate / shaped) for rate in rates_by_repeat(sweep)],
                           rival=Rival("Mbit/s read as MB/s (bits taken for bytes)", BITS_PER_BYTE))


def simulated_link_bytes(nbytes: int, nodes: int, per_node: int) -> dict[str, int]:
    """Bytes node 0 sends across in the simulator: flat ring vs two-level, for float32 data of ``nbytes``."""
    arrays = [np.zeros(max(1, nbytes // 4), np.float32) for _ in range(nodes * per_node)]
    return {"flat": int(inter_node_bytes(allreduce(arrays, "ring"), per_node)[0]),
            "hierarchical": int(inter_node_bytes(hierarchical_allreduce(arrays, per_node), per_node)[0])}


def verdict(predicted: dict[str, float], measured_ratio: float | None, spread: float = 1.0) -> dict[str, Any]:
    """Which algorithm the model says wins, whether its margin is clear and the rounds steady enough to judge
    (``spread``: largest / smallest paired ratio over the rounds), and whether the clock agrees."""
    winner = min(predicted, key=predicted.get)
    margin = max(predicted.values()) / max(min(predicted.values()), 1e-12)
    measured = None if measured_ratio is None else ("hierarchical" if measured_ratio < 1 else "flat")
    clear = margin >= MARGIN and measured_ratio is not None and spread <= NOISY_SPREAD
    return {"model winner": winner, "model margin": margin, "clock winner": measured,
            "decided": clear, "agrees": (measured == winner) if clear else None}


def allreduce_table(results: Sequence[dict], fits: dict[str, LinkFit], rate_mbit_s: float) -> list[dict[str, Any]]:
    """Per size: measured and modelled times, bytes across (counted and simulated), exactness, the verdict."""
    nodes = results[0]["world_size"] // results[0]["local_world_size"]
    per_node = results[0]["local_world_size"]
    rows = []
    for nbytes, row in allreduce_summary(results).items():
        predicted = predicted_times_s(nodes, per_node, nbytes, fits["intra"].link(), fits["inter"].link())
        simulated = simulated_link_bytes(nbytes, nodes, per_node)
        rows.append({"link (Mbit/s)": rate_mbit_s, "size (KiB)": nbytes / 1024,
                     "flat (ms)": row["flat_s"] * 1e3, "two-level (ms)": row["hierarchical_s"] * 1e3,
                     "two-level / flat (paired)": row["hier_over_flat"], "round spread": row["round_spread"],
                     "model flat (ms)": predicted["flat"] * 1e3, "model two-level (ms)": predicted["hierarchical"] * 1e3,
                     "flat bytes across": row["flat_node_tx_bytes"], "flat simulated": simulated["flat"],
                     "two-level bytes across": row["hierarchical_node_tx_bytes"],
                     "two-level simulated": simulated["hierarchical"], "exact": row["exact"],
                     **verdict(predicted, row["hier_over_flat"], row["round_spread"])})
    return rows


def kernel_netns() -> str:
    """This process's network namespace id ('net:[inode]'): the host's, which no node may share."""
    return os.readlink("/proc/self/ns/net")


def no_lab_address_on_host() -> bool:
    """True when the host's own network has no address of the lab's private range (nothing leaked onto it)."""
    out = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True, timeout=10).stdout
    return f"{SUBNET}." not in out


def places_are_node_by_node(results: Sequence[dict], nodes: int, per_node: int) -> bool:
    """Every rank present once; RANK = GROUP_RANK x per_node + LOCAL_RANK; one address per node, all different."""
    ranks = sorted(r["rank"] for r in results)
    layout = all(r["rank"] == r["group_rank"] * per_node + r["local_rank"] and r["world_size"] == nodes * per_node
                 and r["owns_node_addr"] for r in results)
    addrs = {g: {r["node_addr"] for r in results if r["group_rank"] == g} for g in range(nodes)}
    return (ranks == list(range(nodes * per_node)) and layout and all(len(a) == 1 for a in addrs.values())
            and len(set().union(*addrs.values())) == nodes)


def two_level_edge(table: Any, rate_mbit_s: float) -> dict[str, float]:
    """At the largest size on this link speed: flat time / two-level time, measured (paired) and modelled, and
    how far the paired ratio moved between rounds."""
    rows = table[table["link (Mbit/s)"] == rate_mbit_s]
    row = rows.loc[rows["size (KiB)"].idxmax()]
    return {"measured": round(float(1.0 / row["two-level / flat (paired)"]), 3),
            "model": round(float(row["model flat (ms)"] / row["model two-level (ms)"]), 3),
            "round spread": round(float(row["round spread"]), 2)}


def too_noisy(edge: dict[float, dict[str, float]]) -> str | None:
    """None when every link speed's rounds agree well enough to compare; else the INCONCLUSIVE line to print."""
    worst = max(e["round spread"] for e in edge.values())
    if worst <= NOISY_SPREAD:
        return None
    return (f"INCONCLUSIVE: the paired two-level/flat ratio moved {worst:.2f}x between rounds (over "
            f"{NOISY_SPREAD}x): this machine is too busy to compare the link speeds; rerun on a quieter one")


def edge_shrinks(edge: dict[float, dict[str, float]], rates_mbit_s: Sequence[float]) -> bool:
    """True when, from the slowest link to the fastest, the two-level advantage falls in the model and the clock."""
    slow, fast = edge[min(rates_mbit_s)], edge[max(rates_mbit_s)]
    return fast["measured"] < slow["measured"] and fast["model"] < slow["model"]


def plot_links(results: Sequence[dict], fits: dict[float, dict[str, LinkFit]]) -> Any:
    """One-way time against message size for each link and link speed: the measured medians and the fitted lines."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for rate in fits:
        for link, by_size in at_rate(results, rate)[0]["ping_pong_s"].items():
            if link == "intra" and rate != min(fits):
                continue                         # the intra-node link does not depend on the shaping
            sizes = np.array(sorted(int(s) for s in by_size))
            medians = [float(np.median(by_size[str(s)])) for s in sizes]
            label = "inside a node" if link == "intra" else f"between nodes, shaped to {rate:g} Mbit/s"
            line = ax.loglog(sizes, medians, "o", label=f"{label} (measured)")[0]
            fit = fits[rate][link]
            ax.loglog(sizes, fit.alpha_s + sizes * fit.beta_s_per_byte, "-", color=line.get_color(), alpha=0.6)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("one-way time (s)")
    ax.set_title("Ping-pong: points measured, lines alpha + n*beta fitted")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
