"""What expert parallelism sends: bytes per rank per layer from the formula, from the split sizes the ranks used,
and on their sockets.

Each kept token-copy whose expert sits on another rank crosses the wire twice forward (dispatch, then combine) and
twice backward (each all-to-all's backward is the all-to-all the other way). With the experts split evenly and
every rank's tokens drawn alike, a copy's expert is on another rank with probability (ep - 1)/ep, whatever the
router favours (each rank keeps on average 1/ep of all copies, so (ep - 1)/ep of them leave), so per rank per layer

    bytes = 4 x copies x hidden x bytes_per_element x (ep - 1)/ep,      copies = tokens x k, less the dropped ones

(GShard, Lepikhin et al. 2020, arXiv:2006.16668, Section 2.2). The rival: every copy crosses the wire (share 1).
"""
from __future__ import annotations

import math
from typing import Sequence

from labkit.core.validation import positive_int

ALL_TO_ALLS_PER_LAYER = 4        # dispatch and combine forward, their reverses backward


def leaving_share(ep: int) -> float:
    """The expected share of token-copies whose expert sits on another rank: (ep - 1)/ep."""
    return (positive_int(ep, "ep") - 1) / ep


def ep_bytes_per_layer(copies: float, hidden: int, ep: int, bytes_per_element: int = 4) -> float:
    """Bytes one rank sends per MoE layer, forward + backward: 4 x copies x hidden x bytes x (ep - 1)/ep."""
    return ALL_TO_ALLS_PER_LAYER * copies * positive_int(hidden, "hidden") * bytes_per_element * leaving_share(ep)


def every_copy_crosses_bytes(copies: float, hidden: int, bytes_per_element: int = 4) -> float:
    """The rival: every token-copy crosses the wire, four times (share 1)."""
    return ALL_TO_ALLS_PER_LAYER * copies * hidden * bytes_per_element


def counted_bytes(rank: int, send: Sequence[int], recv: Sequence[int], hidden: int,
                  bytes_per_element: int = 4) -> dict[str, int]:
    """Bytes ``rank`` sent to other ranks in one forward + backward, from the split sizes it used: forward's dispatch
    (``send``) and combine (``recv``, sent back), backward's two all-to-alls (the same two, reversed)."""
    row = hidden * bytes_per_element
    dispatch = (sum(send) - send[rank]) * row
    combine = (sum(recv) - recv[rank]) * row
    return {"forward": dispatch + combine, "backward": combine + dispatch}


def share_tolerance(copies_total: int, ep: int, sds: float = 3.0) -> float:
    """Relative band for the mean over ranks: ``sds`` binomial standard deviations of the leaving share over
    ``copies_total`` independent copies, sqrt(f(1 - f)/N) / f. Which rank a copy lands on is a draw; this is its noise."""
    f = leaving_share(ep)
    if f == 0:
        return 0.0
    return sds * math.sqrt(f * (1 - f) / positive_int(copies_total, "copies_total")) / f


def traffic_rows(runs: dict[int, list[dict]], hidden: int, bytes_per_element: int = 4) -> list[dict]:
    """One row per (ep, rank): kept copies, the share that left, bytes from the formula, from the splits, on the
    sockets (None where the ranks did not run on gloo), and the rival's."""
    rows = []
    for ep, ranks in runs.items():
        for r in ranks:
            copies = sum(r["kept"])
            counted = counted_bytes(r["rank"], r["send"], r["recv"], hidden, bytes_per_element)
            wire = r["wire_bytes"]
            on_wire = None if r["backend"] != "gloo" or None in wire.values() else sum(wire.values())
            rows.append({"ep": ep, "rank": r["rank"], "kept_copies": copies,
                         "left_share": (copies - r["send"][r["rank"]]) / copies,
                         "formula_bytes": ep_bytes_per_layer(copies, hidden, ep, bytes_per_element),
                         "counted_bytes": sum(counted.values()), "wire_bytes": on_wire,
                         "every_copy_bytes": every_copy_crosses_bytes(copies, hidden, bytes_per_element)})
    return rows
