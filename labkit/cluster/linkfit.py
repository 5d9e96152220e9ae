"""From measurements to a model: fit alpha and beta per link, and read the node lab's results.

A message of n bytes over one link takes alpha + n * beta (Hockney 1994; the model Thakur, Rabenseifner & Gropp
2005 use for MPICH's collectives). beta is the least-squares slope of the median one-way time over large messages;
alpha is the measured one-way time of a tiny message. (The intercept of the large-message line is no latency on a
shaped link: tbf lets its burst through at line rate, so the line starts *below* zero.) Both come from the
measurements, not from the shaping setting; the lesson then compares 1/beta with the rate ``tc tbf`` was given.
Torch-free.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from labkit.comm.two_tier import Link
from labkit.core.clock import paired_median
from labkit.core.verdict import relative_spread

TCP_PAYLOAD_SHARE = 1448 / 1514   # TCP payload per Ethernet frame at MTU 1500 with timestamps (RFC 7323 option)


@dataclass(frozen=True)
class LinkFit:
    """alpha (s), beta (s/byte) and the fit's R^2 from a size sweep on one link."""

    alpha_s: float
    beta_s_per_byte: float
    r_squared: float

    @property
    def bandwidth_bytes_s(self) -> float:
        """1 / beta: the payload bytes per second the link carried."""
        return 1.0 / self.beta_s_per_byte

    def link(self) -> Link:
        """The fitted link for the alpha-beta model (alpha clipped at 0: a negative intercept is noise)."""
        return Link(max(0.0, self.alpha_s), self.beta_s_per_byte)


def fit_alpha_beta(sizes_bytes: Sequence[int], times_s: Sequence[float]) -> LinkFit:
    """Least-squares alpha + n * beta through (size, one-way seconds) points; at least two sizes."""
    x, y = np.asarray(sizes_bytes, float), np.asarray(times_s, float)
    if x.shape != y.shape or len(set(x.tolist())) < 2:
        raise ValueError("fit_alpha_beta needs one time per size and at least two different sizes")
    beta, alpha = np.polyfit(x, y, 1)
    if beta <= 0:
        raise ValueError(f"the times do not grow with the size (beta={beta:.3g} s/B): too noisy to fit; "
                         "measure larger messages or more repeats")
    residual = float(np.sum((y - (alpha + beta * x)) ** 2))
    total = float(np.sum((y - y.mean()) ** 2)) or 1.0
    return LinkFit(float(alpha), float(beta), 1.0 - residual / total)


def fit_links(ping_pong_s: Mapping[str, Mapping[Any, Sequence[float]]]) -> dict[str, LinkFit]:
    """One fit per link ('intra', 'inter') from a rank's ping-pong sweep (size -> one-way seconds per repeat):
    alpha = the smallest message's median time, beta = the slope through the larger ones (at least two)."""
    out = {}
    for link, by_size in ping_pong_s.items():
        sizes = sorted(by_size, key=int)
        if len(sizes) < 3:
            raise ValueError(f"link {link!r}: need a tiny message for alpha and two larger sizes for beta, "
                             f"got sizes {sizes}")
        slope = fit_alpha_beta([int(s) for s in sizes[1:]], [statistics.median(by_size[s]) for s in sizes[1:]])
        alpha = statistics.median(by_size[sizes[0]]) - int(sizes[0]) * slope.beta_s_per_byte
        out[link] = LinkFit(max(0.0, alpha), slope.beta_s_per_byte, slope.r_squared)
    return out


def rates_by_repeat(by_size: Mapping[Any, Sequence[float]]) -> list[float]:
    """Each repeat's own 1/beta (bytes/s) through the larger sizes (repeat j of every size is round j); a repeat
    whose times do not grow with the size is left out."""
    sizes = sorted(by_size, key=int)[1:]
    rounds = min(len(by_size[s]) for s in sizes)
    rates = []
    for j in range(rounds):
        beta = float(np.polyfit([int(s) for s in sizes], [by_size[s][j] for s in sizes], 1)[0])
        if beta > 0:
            rates.append(1.0 / beta)
    return rates


def link_spread(by_size: Mapping[Any, Sequence[float]]) -> float:
    """How far one link's repeats disagree: (p90 - p10) / median of their own rates (:func:`rates_by_repeat`)."""
    return relative_spread(rates_by_repeat(by_size))


def expected_payload_bytes_s(rate_mbit_s: float) -> float:
    """The TCP payload rate a link shaped to ``rate_mbit_s`` Mbit/s (of Ethernet frames) can carry."""
    return rate_mbit_s * 1e6 / 8 * TCP_PAYLOAD_SHARE


def allreduce_summary(results: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """Per size: median seconds of each algorithm (slowest rank per round), the paired hierarchical/flat time
    ratio and how far it moved between rounds (largest / smallest: the machine's noise), bytes node 0 sent over
    its link per all-reduce, and whether every rank got the exact sum every time."""
    sizes = sorted(results[0]["allreduce"], key=int)
    per_node = int(results[0]["local_world_size"])
    out = {}
    for size in sizes:
        rows = {alg: [r["allreduce"][size][alg][1:] for r in results] for alg in ("flat", "hierarchical")}
        slowest = {alg: [max(rank[i][0] for rank in rows[alg]) for i in range(len(rows[alg][0]))] for alg in rows}
        node_bytes = {alg: statistics.median(rnd[1] for rnd in rows[alg][0]) for alg in rows}
        exact = all(rnd[2] for alg in rows for rank in rows[alg] for rnd in rank)
        ratios = [h / f for h, f in zip(slowest["hierarchical"], slowest["flat"]) if f > 0]
        out[int(size)] = {"flat_s": statistics.median(slowest["flat"]),
                          "round_spread": max(ratios) / min(ratios) if ratios else float("inf"),
                          "hierarchical_s": statistics.median(slowest["hierarchical"]),
                          "hier_over_flat": paired_median(slowest["hierarchical"], slowest["flat"]),
                          "flat_node_tx_bytes": node_bytes["flat"],
                          "hierarchical_node_tx_bytes": node_bytes["hierarchical"],
                          "exact": exact, "ranks_per_node": per_node}
    return out
