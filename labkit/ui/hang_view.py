"""A provoked hang as a picture (notebook 09b): each rank's flight record as a row of boxes, one per collective it
entered, placed by sequence id; the odd call out marked; then, per rank, how long it waited and how it ended.

Drawn from a :class:`labkit.parallel.debug.hangs.HangEvidence` alone: the boxes are the ranks' own records (what
:func:`labkit.parallel.debug.flight_recorder.diagnose` read), the wait bars the seconds each rank noted when its
collective raised, the dashed line the collective timeout the run was given. Sequence id is the order of the
calls on every rank alike, so a column is one collective that every rank should have entered.
"""
from __future__ import annotations

import re

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from labkit.parallel.debug.hangs import HangEvidence

ENTERED, ODD, LAST, NEVER = "C0", "C3", "C1", "C3"
BOX_WIDTH = 0.9


KILLED = re.compile(r"rank (\d+) was killed by (\w+)")


def rank_outcome(ev: HangEvidence, rank: int) -> str:
    """How one rank ended: 'timed out' or the error's type (from the note it wrote when its collective raised),
    'killed by SIGKILL' (from the launcher's line), else 'raised nothing' (it finished, or was stopped quietly)."""
    note = ev.errors.get(rank)
    if note and note.get("error"):
        text = note["error"]
        if "timed out" in text.lower() or "timeout" in text.lower():
            return "timed out"
        return text.split(":", 1)[0][:28]
    killed = KILLED.search(ev.launcher_said)
    if killed and int(killed.group(1)) == rank:
        return f"killed by {killed.group(2)}"
    return "raised nothing"


def _label(entry: dict) -> str:
    sizes = ",".join("x".join(map(str, s)) for s in entry["sizes"])
    return f"{entry['op']}\n[{sizes}]" if sizes else entry["op"]


def _draw_records(ax: plt.Axes, ev: HangEvidence) -> None:
    """One box per recorded collective: blue entered, red the culprit's odd call, hatched the call a rank that
    raised entered last; a dashed red outline where a culprit never entered the collective the others did."""
    d = ev.divergence
    for rank in range(ev.world_size):
        entries = ev.records.get(rank) or []
        for e in entries:
            odd = rank in d.culprits and e["seq"] == d.seq
            last = rank in ev.errors and e is entries[-1]
            ax.barh(rank, BOX_WIDTH, left=e["seq"] - BOX_WIDTH / 2, color=ODD if odd else (LAST if last else ENTERED),
                    edgecolor="k", lw=0.4, hatch="//" if last else None, alpha=0.85)
            ax.text(e["seq"], rank, _label(e), ha="center", va="center", fontsize=6, color="k" if last else "w",
                    bbox=dict(fc="w", ec="none", alpha=0.8, pad=1) if last else None)
        if rank in d.culprits and d.seq is not None and not any(e["seq"] == d.seq for e in entries):
            ax.barh(rank, BOX_WIDTH, left=d.seq - BOX_WIDTH / 2, fill=False, edgecolor=NEVER, ls="--", lw=1.2)
            ax.text(d.seq, rank, "never\nentered", ha="center", va="center", fontsize=6, color=NEVER)
        if not entries:
            ax.text(0.6, rank, f"rank {rank}: no flight record", va="center", fontsize=7, color=NEVER)
    seqs = [e["seq"] for es in ev.records.values() for e in es or []] + ([d.seq] if d.seq is not None else [])
    ax.set_xlim(min(seqs, default=1) - 0.6, max(seqs, default=1) + 0.6)
    ax.set_xticks(sorted(set(seqs)))
    ax.set(xlabel="sequence id (the order of collectives, the same on every rank)", ylabel="rank",
           yticks=range(ev.world_size))
    ax.legend(handles=[Patch(color=ENTERED, label="entered"), Patch(color=ODD, label="the odd call out"),
                       Patch(facecolor=LAST, hatch="//", edgecolor="k", label="last call before it raised"),
                       Patch(fill=False, edgecolor=NEVER, ls="--", label="never entered")],
              fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.22), ncol=4, frameon=False)


def _draw_waits(ax: plt.Axes, ev: HangEvidence) -> None:
    """Per rank, the seconds it sat in its collective before raising (none: it did not wait), the outcome beside it,
    and the run's collective timeout as a dashed line."""
    longest = max([ev.pg_timeout_s] + [n.get("waited_s") or 0.0 for n in ev.errors.values()])
    for rank in range(ev.world_size):
        waited = (ev.errors.get(rank) or {}).get("waited_s")
        ax.barh(rank, waited or 0.0, color=LAST if waited else "0.7", edgecolor="k", lw=0.4)
        what = rank_outcome(ev, rank) + (f" after {waited:.1f} s" if waited else "")
        ax.text(0.03 * longest, rank - 0.3, what, va="center", fontsize=7)
    ax.axvline(ev.pg_timeout_s, color="k", ls="--", lw=1)
    ax.text(ev.pg_timeout_s, 1.0, f"timeout {ev.pg_timeout_s:g} s", fontsize=7, ha="center", va="bottom",
            transform=ax.get_xaxis_transform())
    ax.set(xlabel="seconds waited in the collective", xlim=(0, 1.35 * longest))


def plot_hang(ev: HangEvidence, title: str = "") -> Figure:
    """A provoked hang drawn rank by rank: the collectives each rank entered, how long it waited, how it ended.

    On the left each rank's flight record by sequence id, on the right the seconds it waited and its outcome; the
    ranks read top to bottom on both."""
    fig, (records, waits) = plt.subplots(1, 2, figsize=(10, 0.55 * ev.world_size + 1.9), sharey=True,
                                         gridspec_kw={"width_ratios": [3, 1.3]})
    _draw_records(records, ev)
    _draw_waits(waits, ev)
    records.invert_yaxis()
    records.set_title(title or f"{ev.scenario}: the flight records of {ev.world_size} ranks ({ev.backend})",
                      fontsize=9)
    fig.tight_layout()
    return fig
