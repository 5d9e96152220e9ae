"""The flight recorder, on gloo as on NCCL: each rank's ring of its last collectives, dumped and read back.

With ``TORCH_FR_BUFFER_SIZE=N`` every process group keeps its last N collectives: the op
(``profiling_name``, e.g. ``gloo:all_reduce``), the per-group ``collective_seq_id``, the tensor sizes and the
Python stack that called it. torch's private ``_dump_fr_trace()`` returns it as a pickle (through
:func:`labkit.core.torch_compat.flight_record_pickle`); torch's
``torch.distributed.flight_recorder`` tool (``fr_trace``) reads a folder of them; PyTorch documents it for NCCL
only ("Flight Recorder for Debugging Stuck Jobs", pytorch.org tutorials), but gloo records the same entries.

The rank side here arms a :class:`StallWatchdog` (a thread that, if the rank has not finished after
``stall_s``, writes its dump and the stack of every thread, as NCCL's watchdog does on a timeout) and
:func:`dump_rank` (called when a collective raised). The reader (:func:`read_dumps`, :func:`diagnose`) prints,
per rank, the last collective it entered and the first sequence id where the ranks disagree: one rank missing,
or a different op or shape. Caveat: on gloo a finished collective may still read ``"scheduled"`` (the
recorder's state is set by NCCL's CUDA events), so the reader compares what each rank *entered*, never states.
"""
from __future__ import annotations

import faulthandler
import json
import os
import pickle
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from labkit.core.clock import now_s
from labkit.core.torch_compat import flight_record_pickle

FR_ENV = "TORCH_FR_BUFFER_SIZE"
DEFAULT_BUFFER_ENTRIES = 2000
TORCH_DIRS = (f"{os.sep}torch{os.sep}", f"{os.sep}labkit{os.sep}parallel{os.sep}debug{os.sep}flight_recorder.py")


def recorder_env(entries: int = DEFAULT_BUFFER_ENTRIES) -> dict[str, str]:
    """The environment a launch needs for the flight recorder (set before the process group starts)."""
    return {FR_ENV: str(int(entries))}


def fr_trace_pickle(stack_traces: bool = True) -> bytes | None:
    """This process's flight-recorder dump (pickle bytes), or None where torch has no such API (older builds).

    Only the main thread may ask for the stack traces: torch 2.14 symbolizes them under the GIL, and a second
    thread asking for them while the main thread waits in a gloo collective blocks (measured here)."""
    nccl = dist.is_initialized() and dist.get_backend() == "nccl"     # NCCL keeps its own recorder; gloo's is generic
    return flight_record_pickle(nccl, stack_traces)


def dump_rank(folder: str | Path, note: dict | None = None, stacks: bool = False, blob: bytes | None = None) -> None:
    """Write this rank's flight record (``rank<R>.pkl``), a note (``rank<R>.json``) and optionally its stacks."""
    folder, rank = Path(folder), dist.get_rank()
    blob = fr_trace_pickle() if blob is None else blob
    if blob is not None:
        tmp = folder / f"rank{rank}.pkl.{threading.get_ident()}"
        tmp.write_bytes(blob)
        os.replace(tmp, folder / f"rank{rank}.pkl")      # a reader never sees half a dump
    if note is not None:
        (folder / f"rank{rank}.json").write_text(json.dumps(note))
    if stacks:
        with open(folder / f"rank{rank}.stack", "w") as out:
            out.write(f"main thread 0x{threading.main_thread().ident:016x}\n")
            faulthandler.dump_traceback(out, all_threads=True)


class StallWatchdog:
    """A thread that keeps this rank's flight record on disk (rewritten whenever it grew, every ``poll_s``) and,
    once no new collective was entered for ``stall_s``, writes the stack of every thread: what NCCL's watchdog
    dumps on a timeout, here also for gloo, and also for a rank that is then killed or crashes."""

    def __init__(self, folder: str | Path, stall_s: float, poll_s: float = 0.1) -> None:
        self.folder, self._done = Path(folder), threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(stall_s, poll_s), daemon=True)

    def __enter__(self) -> "StallWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _watch(self, stall_s: float, poll_s: float) -> None:
        last, changed_s, stacks_written = None, now_s(), False
        while not self._done.wait(poll_s):
            blob = fr_trace_pickle(stack_traces=False)
            if blob != last:
                last, changed_s = blob, now_s()
                dump_rank(self.folder, blob=blob)
            elif not stacks_written and now_s() - changed_s > stall_s:
                dump_rank(self.folder, blob=blob, stacks=True)
                stacks_written = True


# ---------------------------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class Entry:
    """One recorded collective: its sequence id in its group, the op, the input sizes and the caller's line."""

    seq: int
    op: str
    sizes: tuple
    where: str

    def __str__(self) -> str:
        return f"#{self.seq} {self.op}{list(map(list, self.sizes))}" + (f" at {self.where}" if self.where else "")


def _caller(frames: list[dict]) -> str:
    """'file.py:line (function)' of the innermost frame outside torch: the line of the learner's code."""
    for frame in frames or []:
        if not any(d in frame.get("filename", "") for d in TORCH_DIRS):
            return f"{Path(frame['filename']).name}:{frame['line']} ({frame['name']})"
    return ""


def entries_of(dump: dict) -> list[Entry]:
    """The default group's collectives of one rank's dump, oldest first (p2p and other groups left out)."""
    out = []
    for e in dump.get("entries", []):
        if e.get("is_p2p") or str(e.get("pg_id", 0)) != "0":
            continue
        op = str(e.get("profiling_name", "?")).split(":", 1)[-1]
        sizes = tuple(tuple(s) for s in e.get("input_sizes", []))
        out.append(Entry(int(e["collective_seq_id"]), op, sizes, _caller(e.get("frames", []))))
    return sorted(out, key=lambda x: x.seq)


def read_dumps(folder: str | Path, world_size: int) -> dict[int, list[Entry] | None]:
    """Every rank's entries from ``rank<R>.pkl`` in ``folder``; None for a rank that left no dump (it died)."""
    out: dict[int, list[Entry] | None] = {}
    for rank in range(world_size):
        path = Path(folder) / f"rank{rank}.pkl"
        out[rank] = entries_of(pickle.loads(path.read_bytes())) if path.exists() else None
    return out


def entry_states(folder: str | Path, world_size: int) -> dict[str, int]:
    """How many recorded entries read each state ("scheduled", "started", "completed") across the dumps: on gloo
    the recorder never moves an entry past "scheduled", finished or not (the caveat this makes measurable)."""
    states: Counter = Counter()
    for rank in range(world_size):
        path = Path(folder) / f"rank{rank}.pkl"
        if path.exists():
            states.update(str(e.get("state")) for e in pickle.loads(path.read_bytes()).get("entries", []))
    return dict(states)


def as_plain(records: dict[int, list[Entry] | None]) -> dict[int, list[dict]]:
    """Records as plain dicts ({rank: [{'seq', 'op', 'sizes'}]}, [] for a rank without a dump): an exercise's input."""
    return {r: [{"seq": e.seq, "op": e.op, "sizes": [list(s) for s in e.sizes]} for e in es or []]
            for r, es in records.items()}


@dataclass(frozen=True)
class Divergence:
    """Where the ranks' records first disagree, and the rank (or ranks) that disagree with the majority."""

    seq: int | None                      # first sequence id where they differ; None: they agree (or nobody dumped)
    culprits: tuple[int, ...]            # the odd ranks out: missing that collective, or calling another one
    kind: str                            # "agree", "missing", "different call" or "no dump"
    expected: Entry | None               # what the majority entered at ``seq``
    got: dict[int, Entry | None] = field(default_factory=dict)   # what each culprit entered there (None: nothing)
    last: dict[int, Entry | None] = field(default_factory=dict)  # every rank's last entered collective

    def report(self) -> str:
        """Per rank the last collective entered, then the verdict: which rank, which call, which sequence id."""
        lines = [f"rank {r}: last entered {e if e else 'nothing recorded'}" for r, e in sorted(self.last.items())]
        if self.kind == "agree":
            lines.append("all ranks entered the same collectives: the records do not single out a rank")
        elif self.kind == "no dump":
            lines.append(f"rank(s) {list(self.culprits)} left no flight record: the process died")
        elif self.kind == "waiting alone":
            others = sorted(set(self.last) - set(self.culprits))
            lines.append(f"first divergence at #{self.seq}: rank(s) {list(self.culprits)} entered "
                         f"{self.got[self.culprits[0]]}, which rank(s) {others} never entered: they stopped early")
        else:
            for r in self.culprits:
                lines.append(f"first divergence at #{self.seq}: the others entered {self.expected}, rank {r} "
                             + (f"entered {self.got[r]}" if self.got.get(r) else "never entered it"))
        return "\n".join(lines)


def _key(e: Entry | None) -> tuple | None:
    return None if e is None else (e.op, e.sizes)


def diagnose(records: dict[int, list[Entry] | None]) -> Divergence:
    """The first sequence id where the ranks' records disagree, and the ranks outvoted there (majority = right)."""
    last = {r: (es[-1] if es else None) for r, es in records.items() if es is not None}
    dead = tuple(r for r, es in records.items() if es is None)
    if dead:
        return Divergence(None, dead, "no dump", None, {}, last)
    by_seq = {r: {e.seq: e for e in es} for r, es in records.items()}
    top = max((e.seq for es in records.values() for e in es), default=0)
    first = min((e.seq for es in records.values() for e in es), default=1)
    for seq in range(first, top + 1):
        here = {r: by_seq[r].get(seq) for r in records}
        votes = Counter(_key(e) for e in here.values())
        if len(votes) == 1:
            continue
        # the call most ranks entered is taken as right; a tie goes to the call rank order meets first
        order = [_key(here[r]) for r in sorted(here)]
        majority, _ = max(votes.items(), key=lambda kv: (kv[1], kv[0] is not None, -order.index(kv[0])))
        culprits = tuple(r for r, e in here.items() if _key(e) != majority)
        expected = next(e for e in here.values() if _key(e) == majority)
        if majority is None:                 # most ranks stopped: the odd ones out wait in a call nobody else made
            kind = "waiting alone"
        else:
            kind = "missing" if all(here[r] is None for r in culprits) else "different call"
        return Divergence(seq, culprits, kind, expected, {r: here[r] for r in culprits}, last)
    return Divergence(None, (), "agree", None, {}, last)


def stuck_stack(folder: str | Path, rank: int, lines: int = 6) -> str:
    """The innermost frames of the main thread's stack that the watchdog wrote for ``rank`` ('' if none)."""
    path = Path(folder) / f"rank{rank}.stack"
    if not path.exists():
        return ""
    head, _, text = path.read_text(errors="replace").partition("\n")
    main = head.split()[-1]                              # faulthandler names threads by this id
    blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
    block = next((b for b in blocks if b.splitlines()[0].split(" (")[0].endswith(main)), "")
    frames = [ln.strip() for ln in block.splitlines()[1:]
              if ln.strip().startswith("File") and f"{os.sep}torch{os.sep}" not in ln]   # the rank's own code
    return "\n".join(frames[:lines])
