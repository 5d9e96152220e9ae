"""Run a learner's function inside a notebook kernel without letting it hurt the check or the kernel.

:func:`run_guarded` calls the function on private deep copies of its arguments, in a worker thread, under a
time limit, with what it prints captured (and capped), and everything it raises caught, ``SystemExit`` and
``KeyboardInterrupt`` included. Why a thread, and not a subprocess or a signal:

* a subprocess (fork) would need the learner's function to survive pickling or a fork of a kernel that holds
  OpenMP/CUDA state (both break torch); a thread shares the kernel and needs neither;
* a ``SIGALRM`` timer would run the answer in the main thread, where a ``KeyboardInterrupt`` the answer raises
  and the user's Ctrl-C look the same, and an answer that catches ``BaseException`` in a loop could never be
  left. In the thread, anything the answer raises is the answer's, while the kernel's main thread only waits
  (in short slices, so a real Ctrl-C interrupts the check at once and is re-raised).

At the limit the worker is sent an asynchronous ``_Stopped`` exception (CPython's ``PyThreadState_SetAsyncExc``),
which ends a pure-Python loop at its next bytecode. A thread cannot be killed while it sits in one C call
(``time.sleep(60)``, one huge matmul): the check then gives up waiting after a short grace period, reports the
time-out, and the exception fires when that call returns; an answer that catches the stop and keeps looping is
reported as still running (restart the kernel). Either way the verdict arrives within the limit plus the grace.

All of the answer's own code runs in that thread: the call, the conversion of its value (``convert``), its
exception's message (``__str__``), and the release of what it made (its ``__del__``, its traceback's frames). The
main thread only ever sees plain data and a stand-in of the exception, built from its message. What no thread can
guard, said plainly: a C call that holds the interpreter lock (``sum(range(10**9))``, a runaway regex) stops every
thread, so the verdict and the Interrupt button wait until it returns; ``os._exit`` or an allocation larger than
the memory ends the kernel itself; an object in a reference cycle is freed whenever Python's collector runs.
"""
from __future__ import annotations

import copy
import ctypes
import io
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from labkit.core.clock import Deadline

OUTPUT_CAP_CHARS = 2_000        # what a verdict quotes of the learner's prints; the rest is counted, not kept
GRACE_S = 0.5                   # how long a stopped worker gets to unwind before the check stops waiting
_SLICE_S = 0.05                 # the main thread waits in slices this short, so a real Ctrl-C is seen at once
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
_MESSAGE_CHARS = 300            # an exception's message is cut here (an answer may raise a huge one)
_PRINT_LINES = 6                # lines of the answer's output quoted in a verdict


class AnswerProblem(Exception):
    """A fault of the answer found by kit code in the guarded thread (say, a wrong signature): its message is the
    whole report."""


class AnswerRaised(Exception):
    """Stands in for an exception of the answer's own class (its message only, so none of its methods runs later)."""


class _Stopped(BaseException):
    """Raised inside the learner's thread when its time is up (a BaseException: ``except Exception`` misses it)."""


@dataclass(frozen=True)
class Outcome:
    """What one guarded call did: its value, or what it raised, or that it ran out of time; and what it printed."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    still_running: bool = False
    output: str = ""
    output_chars: int = 0
    error_text: str | None = None

    @property
    def ok(self) -> bool:
        """True when the call returned a value within the limit."""
        return self.error is None and not self.timed_out


class _Capture(io.TextIOBase):
    """Stands in for sys.stdout/sys.stderr: keeps the first ``cap`` characters the worker thread writes, counts
    the rest, and passes every other thread's writes through."""

    def __init__(self, original: Any, worker: set[int], cap: int) -> None:
        self.original, self.worker, self.cap = original, worker, cap
        self.kept: list[str] = []
        self.kept_chars = self.total_chars = 0

    def write(self, text: str) -> int:
        if threading.get_ident() not in self.worker:
            return self.original.write(text)
        text = str(text)
        self.total_chars += len(text)
        room = self.cap - self.kept_chars
        if room > 0:
            self.kept.append(text[:room])
            self.kept_chars += min(room, len(text))
        return len(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.worker:
            self.original.flush()


def _stop(thread: threading.Thread) -> None:
    """Ask CPython to raise :class:`_Stopped` in ``thread`` at its next bytecode."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Stopped))


def _wait(thread: threading.Thread, timeout_s: float) -> None:
    """Join in short slices: the main thread then notices a pending Ctrl-C within a slice."""
    deadline = Deadline(max(timeout_s, 1e-3))
    while thread.is_alive() and not deadline.expired:
        thread.join(min(_SLICE_S, deadline.remaining_s))


def _stand_in(err: BaseException, text: str) -> BaseException:
    """A fresh exception of a built-in class with the same message, else :class:`AnswerRaised` (no answer code)."""
    kind = type(err)
    if kind.__module__ == "builtins":
        try:
            return kind(text)
        except Exception:  # a built-in class whose constructor wants more arguments (UnicodeDecodeError)
            pass
    return AnswerRaised(text)


def _answer_in_worker(fn: Callable[..., Any], kwargs: dict, convert: Callable[[Any], Any], box: dict) -> None:
    """The call, its conversion, its error's message and the release of everything it made, all in the worker."""
    private = copy.deepcopy(kwargs)
    try:
        box["value"] = convert(fn(**private))
    except BaseException as err:            # noqa: B036 - SystemExit and KeyboardInterrupt raised by the answer
        box["stopped"] = type(err) is _Stopped
        box["text"] = learner_error(err)
        box["error"] = _stand_in(err, box["text"])
        if err.__traceback__ is not None:
            traceback.clear_frames(err.__traceback__)   # the answer's locals are freed here, not in the kernel
    del private


def run_guarded(fn: Callable[..., Any], kwargs: dict, time_limit_s: float,
                convert: Callable[[Any], Any] = lambda v: v) -> Outcome:
    """Call ``fn(**deepcopy(kwargs))`` in a worker thread, time-limited, output captured; ``convert`` (run in the
    worker too, so a hostile return value's methods are time-limited as well) turns the value into plain data."""
    box: dict[str, Any] = {}
    worker: set[int] = set()

    def body() -> None:
        worker.add(threading.get_ident())
        try:
            _answer_in_worker(fn, kwargs, convert, box)
        except BaseException as late:       # noqa: B036 - the stop, or a fault while the leftovers are described
            if type(late) is _Stopped:
                box["stopped"] = True
            elif "value" not in box:
                box.setdefault("text", f"your code raised an error that could not be described ({type(late).__name__})")
                box.setdefault("error", AnswerRaised(box["text"]))

    out, err_stream = _Capture(sys.stdout, worker, OUTPUT_CAP_CHARS), _Capture(sys.stderr, worker, 0)
    thread = threading.Thread(target=body, name="labkit-exercise-answer", daemon=True)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err_stream
    try:
        thread.start()
        _wait(thread, time_limit_s)
        timed_out = thread.is_alive()
        if timed_out:
            _stop(thread)
            _wait(thread, GRACE_S)
    except KeyboardInterrupt:               # the user's Ctrl-C (the answer's own would be raised in the worker)
        _stop(thread)
        raise
    finally:
        sys.stdout, sys.stderr = saved
    timed_out = timed_out or bool(box.get("stopped"))
    return Outcome(value=box.get("value"), error=None if timed_out else box.get("error"), timed_out=timed_out,
                   still_running=thread.is_alive(), output="".join(out.kept),
                   output_chars=out.total_chars + err_stream.total_chars,
                   error_text=None if timed_out else box.get("text"))


def learner_error(err: BaseException) -> str:
    """The learner's exception in one short block: its type, message and the learner's own line that raised it
    (run in the guarded thread: ``__str__`` is the answer's code)."""
    if type(err) is AnswerProblem:
        return str(err.args[0])
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(_PACKAGE_DIR)]
    where = ""
    if frames:
        last = frames[-1]
        where = f"\n  in your code, line {last.lineno}: {(last.line or '').strip()}"
    try:
        message = str(err)
        message = message if type(message) is str else "(its message is not a str)"
    except BaseException as why:  # noqa: B036 - a __str__ that fails, even with SystemExit, is still the learner's
        message = f"(its message could not be shown: its __str__ raised {type(why).__name__})"
    if len(message) > _MESSAGE_CHARS:
        message = message[:_MESSAGE_CHARS] + " ..."
    advice = {SystemExit: " (sys.exit()/exit() would end the program: return the answer instead)",
              KeyboardInterrupt: " (raised by your code, not by Ctrl-C)"}.get(type(err), "")
    return f"your code raised {type(err).__name__}: {message}{advice}{where}"


def describe_problem(outcome: Outcome, limit_s: float) -> str | None:
    """What went wrong with one guarded call, in the learner's terms; None when it returned a value."""
    if outcome.still_running:
        return (f"your function did not return within {limit_s:.3g} s and is still running in the background: a "
                "sleep or one long C call ends when it returns, a loop that catches the stop never does (then "
                "restart the kernel: Kernel > Restart)")
    if outcome.timed_out:
        return f"your function did not return within {limit_s:.3g} s (a loop that never ends, or a sleep?)"
    if outcome.error_text is not None:
        return outcome.error_text
    return learner_error(outcome.error) if outcome.error is not None else None


def describe_output(outcomes: list[Outcome]) -> str:
    """The first lines the answer printed (capped), or '' when it printed nothing."""
    total = sum(o.output_chars for o in outcomes)
    if not total:
        return ""
    lines = "".join(o.output for o in outcomes).splitlines()[:_PRINT_LINES]
    quoted = "".join(f"\n    | {line[:120]}" for line in lines)
    return f"\n  your function printed {total:,} characters; the first lines:{quoted}"
