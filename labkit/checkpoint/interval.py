"""How often to save: the interval that loses the least time to saving and to lost work, for a save cost and a
failure rate.

Saving every ``tau`` seconds costs ``C / tau`` of the run in saves; a failure, arriving on average every ``M``
seconds (the mean time between failures), loses on average half an interval of work, ``tau / 2M`` of the run.
Their sum is least at ``tau = sqrt(2 C M)`` (Young 1974, "A first order approximation to the optimum checkpoint
interval", Commun. ACM 17(9)). Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart
dumps", Future Generation Computer Systems 22(3)) adds the restart time and higher-order terms; his first-order
correction is ``sqrt(2 C M) - C`` for ``C < 2M``. Torch-free.
"""
from __future__ import annotations

import math

from labkit.core.validation import positive_number

HOUR_S = 3600.0


def young_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Young's optimum seconds between checkpoints: sqrt(2 x save cost x mean time between failures)."""
    return math.sqrt(2.0 * positive_number(save_cost_s, "save_cost_s") * positive_number(mtbf_s, "mtbf_s"))


def daly_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's first-order corrected optimum, sqrt(2 C M) - C (valid for C < 2M; M itself beyond)."""
    if save_cost_s >= 2 * mtbf_s:
        return positive_number(mtbf_s, "mtbf_s")
    return young_interval_s(save_cost_s, mtbf_s) - save_cost_s


def wasted_fraction(interval_s: float, save_cost_s: float, mtbf_s: float) -> float:
    """First-order share of the run lost: saving (C / tau) plus the work redone after a failure (tau / 2M)."""
    positive_number(interval_s, "interval_s")
    return save_cost_s / interval_s + interval_s / (2.0 * mtbf_s)


def cluster_mtbf_s(node_mtbf_s: float, nodes: int) -> float:
    """A job fails when any of its nodes does: independent nodes divide the mean time between failures."""
    return positive_number(node_mtbf_s, "node_mtbf_s") / positive_number(nodes, "nodes")


def interval_table(save_cost_s: float, mtbf_s: float, factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
                   ) -> list[dict]:
    """Young's interval and multiples of it, each with the share of the run it loses."""
    best = young_interval_s(save_cost_s, mtbf_s)
    return [{"interval_s": f * best, "times_young": f, "wasted_fraction": wasted_fraction(f * best, save_cost_s,
                                                                                          mtbf_s)}
            for f in factors]
