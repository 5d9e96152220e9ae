"""The first failure of a multi-node job, named where it happened: which node, which ranks, and what happened to it.

A job across nodes fails in a cascade: one node dies (its processes killed, its link cut), and a few seconds later
every other node's collectives fail and torch prints its dump there. Read at the end, the first exit code in node
order blames a bystander (node 0, "exited with code 1"), and a cut link only shows as a timeout. :func:`watch_job`
watches while the job runs instead: each node's launcher (how and *when* it ended), the switch's port of every node
(``sw<k>``: gone or down when a link was deleted), and which ranks each node holds (read from its workers' own
``RANK`` while they live). The first fault stops the wait; :func:`fault_message` says it in one or two lines.
"""
from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from labkit.cluster.nodes import EmulatedNodes
from labkit.comm.rank_watch import RankWatch
from labkit.core.clock import Deadline, now_s
from labkit.core.validation import positive_number

LINK_EVERY_S = 1.0     # how often the switch's ports and the nodes' ranks are read (one `ip` call each)


@dataclass(frozen=True)
class NodeFault:
    """What went wrong first: the node, what happened to it, and when (seconds into the wait)."""

    node: int
    what: str
    at_s: float


@dataclass
class JobWatch:
    """The wait's outcome: exit codes (None: still running when it stopped), the first fault, each node's ranks."""

    codes: list[int | None]
    fault: NodeFault | None = None
    ranks: dict[int, list[int]] = field(default_factory=dict)
    frozen: list[int] = field(default_factory=list)     # ranks stopped (state T) when the wait timed out


def exit_words(code: int) -> str:
    """How a launcher ended, in words: its exit code, or the signal that killed it and who sends that one."""
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    hint = " (kill -9, or the kernel's out-of-memory killer)" if -code == signal.SIGKILL else ""
    return f"was killed by {name}{hint}"


def link_faults(nodes: EmulatedNodes) -> dict[int, str]:
    """Node -> what is wrong with its link ({} when every node's port on the switch is there and up)."""
    ports = {entry["ifname"]: entry for entry in json.loads(nodes.host_run(["ip", "-j", "link", "show"]) or "[]")}
    faults = {}
    for node in range(nodes.config.nodes):
        port = ports.get(f"sw{node}")
        if port is None:
            faults[node] = f"lost its link (sw{node}, its cable to the switch, is gone)"
        elif not {"UP", "LOWER_UP"} <= set(port.get("flags", [])):
            faults[node] = f"lost its link (sw{node} is down)"
    return faults


def node_ranks(nodes: EmulatedNodes, node: int, marks: Path) -> list[int]:
    """The global ranks of the workers running on ``node`` now: the ``rank<R>.pid`` marks they left in ``marks``
    (labkit.comm.worker.mark_rank) whose process runs in that node's namespace ([] before they start)."""
    here = set(nodes.pids(node))
    ranks = []
    for mark in Path(marks).glob("rank*.pid"):
        with contextlib.suppress(OSError, ValueError):
            if int(mark.read_text()) in here:
                ranks.append(int(mark.stem[4:]))
    return sorted(ranks)


def watch_job(nodes: EmulatedNodes, procs: Sequence[subprocess.Popen], timeout_s: float, marks: Path,
              poll_s: float = 0.2, started_s: float | None = None) -> JobWatch:
    """Wait for every node's launcher; stop at the first fault (a launcher that failed, a link gone) or the timeout.

    ``marks``: the folder of the ranks' pid marks (``$LABKIT_RANK_MARKS``); ``started_s``
    (:func:`labkit.core.clock.now_s` when the job started) dates the fault; processes still running
    are left to the caller (``nodes.kill_all``): the wait only reads.
    """
    deadline = Deadline(positive_number(timeout_s, "timeout_s"))
    start = now_s() if started_s is None else started_s
    watch, next_look_s = JobWatch([None] * len(procs)), 0.0
    while watch.fault is None and not deadline.expired and any(c is None for c in watch.codes):
        running = next(p for p, c in zip(procs, watch.codes) if c is None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.wait(timeout=min(poll_s, max(0.01, deadline.remaining_s)))
        for node, proc in enumerate(procs):
            if watch.codes[node] is None and proc.poll() is not None:
                watch.codes[node] = proc.returncode
                if proc.returncode != 0 and watch.fault is None:
                    watch.fault = NodeFault(node, f"its launcher {exit_words(proc.returncode)}", now_s() - start)
        if watch.fault is None and now_s() - start >= next_look_s:
            next_look_s = now_s() - start + LINK_EVERY_S
            _look_at_nodes(nodes, watch, marks, now_s() - start)
    if watch.fault is None and any(c is None for c in watch.codes):      # timed out: read before the kill
        watch.frozen = frozen_ranks(marks)
    return watch


def frozen_ranks(marks: Path) -> list[int]:
    """The ranks (by their ``rank<R>.pid`` marks) whose process is stopped now: state T, SIGSTOP or a debugger."""
    pids = {}
    for mark in Path(marks).glob("rank*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids[int(mark.stem[4:])] = int(mark.read_text())
    watch = RankWatch(sample_every_s=0.0)
    watch.sample(pids)
    return sorted(watch.frozen(sorted(pids)))


def _look_at_nodes(nodes: EmulatedNodes, watch: JobWatch, marks: Path, at_s: float) -> None:
    """Record the ranks of nodes not yet seen, and a link that went (the first one found is the fault)."""
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired, ValueError):
        for node in range(nodes.config.nodes):
            if not watch.ranks.get(node):
                watch.ranks[node] = node_ranks(nodes, node, marks)
        cut = link_faults(nodes)
        if cut:
            node = min(cut)
            watch.fault = NodeFault(node, cut[node], at_s)


def fault_message(target: str, watch: JobWatch, outputs: Sequence[str], tail_lines: int = 8) -> str:
    """One or two lines naming the node and ranks that failed first and what happened to it, then its last lines."""
    fault = watch.fault
    if fault is None:
        raise ValueError("no fault to describe")
    ranks = watch.ranks.get(fault.node) or []
    who = f"node {fault.node} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})" if ranks \
        else f"node {fault.node}"
    text = f"{target}: {who} failed first, {fault.at_s:.1f} s in: {fault.what}."
    if len(watch.codes) > 1:
        text += "\nEvery process on every node was then stopped; what the other nodes printed only followed from it."
    tail = [line for line in outputs[fault.node].strip().splitlines() if line.strip()][-tail_lines:]
    return text + (f"\nNode {fault.node}'s last lines:\n" + "\n".join(tail) if tail else "")
