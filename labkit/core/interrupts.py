"""Ctrl-C and SIGTERM while a process starts: held until a framework import is done, then one line and 130/143.

Kept apart from :mod:`labkit.core.results` and its imports (json, shutil, pathlib), so that ``labkit/__init__.py``
can hold signals from its very first line: anything imported before that is a window in which Ctrl-C interrupts
a half-done import. Before Python runs that line (the interpreter's own start-up and ``site``) Python's defaults
apply. Imports only ``contextlib``, ``os``, ``signal`` and ``sys``.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Callable, Iterator

SIGNAL_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"}


def exit_for_signal(signum: int) -> None:
    """End a command the way an interrupt ends it everywhere in the kit: one line on stderr, exit 130 or 143."""
    print(SIGNAL_WORDS.get(signum, f"stopped by signal {signum}"), file=sys.stderr)
    raise SystemExit(128 + signum)


def started_as_command() -> bool:
    """True when this process is the `labkit` command (``python -m labkit`` or the console script), not a notebook."""
    argv = list(getattr(sys, "orig_argv", []))
    as_module = any(a == "-m" and b == "labkit" for a, b in zip(argv, argv[1:]))
    return as_module or (len(argv) > 1 and os.path.basename(argv[1]) == "labkit")


@contextlib.contextmanager
def signals_deferred(on_arrival: Callable[[int], None] | None = None) -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends (a framework import they would leave half done), then deliver.

    The first one that arrives is recorded by a Python-level handler and raised again, with the handlers that were
    there before, as the block ends. Python runs such handlers in the main thread whichever thread the kernel
    picked, so this holds even where a library thread (OpenBLAS, OpenMP) that does not block the signal exists
    already; a blocked signal mask on the main thread alone does not (the kernel then delivers to that thread).
    """
    arrived: list[int] = []     # ``on_arrival``: what to do instead of delivering it (exit_for_signal)
    try:
        previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:          # not the main thread: only the main thread has signal handlers
        previous = None
    if previous is None:
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)
        if arrived:       # now: ``on_arrival(signum)``, or the handlers that were there before
            (on_arrival or signal.raise_signal)(arrived[0])
