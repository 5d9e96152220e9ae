"""Results that survive: atomic files, rows saved as each one finishes, and a clear word when work stops early.

Every file the kit writes goes through :func:`atomic_path` (a temporary name beside the target, then
``os.replace``), so a reader sees the old file or the new one, never half of one; a full, read-only or forbidden
disk becomes one :class:`WriteError` line that names the path and the cause, and the temporary file is removed.
A long command keeps its finished rows in a :class:`ResultStream`: each ``add`` rewrites a JSON-lines file
atomically, and when the work stops early (Ctrl-C, SIGTERM, its own timeout) :meth:`ResultStream.stopped` says
how much finished and where it is. :func:`sigterm_as_interrupt` makes SIGTERM unwind like Ctrl-C. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

CAUSES = {errno.ENOSPC: "the disk is full (ENOSPC)", errno.EROFS: "the file system is read-only (EROFS)",
          errno.EACCES: "permission denied (EACCES)", errno.EPERM: "operation not permitted (EPERM)",
          errno.EDQUOT: "the disk quota is used up (EDQUOT)", errno.ENOENT: "its folder does not exist (ENOENT)",
          errno.ENOTDIR: "a part of the path is a file, not a folder (ENOTDIR)"}


class WriteError(OSError):
    """A file could not be written; the message names the path and the cause, and nothing half-written is left."""


class Terminated(SystemExit):
    """SIGTERM as an exception that unwinds like Ctrl-C (clean-up runs), and exits 143 if nothing catches it."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


class StoppedEarly(Exception):
    """The work stopped part-way; what finished was already shown and saved. ``code`` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def describe_os_error(path: str | Path, err: OSError) -> str:
    """One line: which path, and why in words a user can act on."""
    cause = CAUSES.get(err.errno or -1, err.strerror or type(err).__name__)
    return f"cannot write {path}: {cause}"


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename, else it is removed.

    For writers that want a file name (``torch.save``, a profiler's trace export); the bytes land under
    ``.NAME.PID.tmp`` in the same folder, so the rename never crosses file systems.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if not tmp.exists():    # a writer that swallows its own OSError (torch's trace export does)
            free = shutil.disk_usage(target.parent).free
            full = "the disk is full (ENOSPC); " if free < 2**20 else ""
            raise WriteError(f"cannot write {target}: {full}the writer produced no file, {free / 2**20:.1f} MiB free")
        os.replace(tmp, target)
    except WriteError:
        raise
    except OSError as err:
        raise WriteError(describe_os_error(target, err)) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (synced to disk before the rename); returns the path."""
    target = Path(path)
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return target


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


class ResultStream:
    """The finished rows of a long command, saved to a JSON-lines file as each one finishes.

    ``what`` names the units in messages ("batch sizes", "rungs", "message sizes"); ``total`` is how many were
    asked for. The file is rewritten atomically on every ``add``, so it always holds every finished row.
    """

    def __init__(self, path: str | Path | None, total: int, what: str) -> None:
        self.path = None if path is None else Path(path)
        self.total, self.what = total, what
        self.rows: list[Any] = []
        self.saved = 0          # rows in the file (fewer than len(rows) after a failed write)
        self.phase = ""         # set while work after the rows runs, e.g. "the largest-batch search"

    def add(self, row: Any, to_json: Callable[[Any], Any] = lambda r: r) -> None:
        """Keep one finished row and save every row so far."""
        self.rows.append(row)
        if self.path is not None:
            created = missing_folders(self.path.parent)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                atomic_write_text(self.path, "".join(json.dumps(to_json(r), default=str) + "\n" for r in self.rows))
            except WriteError:
                remove_empty(created)       # a failed first write leaves no empty folder behind
                raise
            self.saved = len(self.rows)
        raise_if_signalled()     # an interrupt swallowed while this row ran stops the work now, the row kept

    def reload(self) -> None:
        """Take the rows another process saved to ``path`` (a launched rank streams them; the launcher shows them)."""
        if self.path is not None and self.path.exists():
            self.rows = read_json_lines(self.path)
            self.saved = len(self.rows)

    def stopped(self, why: str) -> str:
        """'interrupted after 4 of 6 batch sizes; results so far in PATH' (what finished, what did not)."""
        where = "" if self.path is None or not self.saved else f"; results so far in {self.path}" \
            if self.saved == len(self.rows) else f"; the first {self.saved} saved in {self.path}"
        during = f" during {self.phase}," if self.phase else ""
        return f"{why}{during} after {len(self.rows)} of {self.total} {self.what}{where}"


def stop_reason(err: BaseException) -> str:
    """How a run was stopped, in a word: 'terminated (SIGTERM)', 'interrupted (Ctrl-C)', 'timed out'."""
    if isinstance(err, Terminated):
        return "terminated (SIGTERM)"
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(err, WriteError):
        return "stopped: a result could not be saved"
    return "timed out" if isinstance(err, TimeoutError) else f"stopped by an error ({type(err).__name__})"


@contextlib.contextmanager
def keep_finished(stream: ResultStream, show: Callable[[list], None],
                  failures: tuple[type[BaseException], ...] = ()) -> Iterator[ResultStream]:
    """On Ctrl-C, SIGTERM, a timeout or a failed write inside: ``show`` the finished rows, say what did not finish.

    Raises StoppedEarly with exit status 130 (Ctrl-C), 143 (SIGTERM) or 1 (timeout, write failure, or one of
    ``failures`` after some rows finished, e.g. a rank killed: its whole message follows the count).
    """
    try:
        yield stream
    except (KeyboardInterrupt, Terminated, TimeoutError, WriteError) as err:
        forget_signal()
        if stream.rows:
            with contextlib.suppress(Exception):
                show(stream.rows)
        code = 143 if isinstance(err, Terminated) else 130 if isinstance(err, KeyboardInterrupt) else 1
        first_line = str(err).splitlines()[0] if str(err) else ""
        detail = f" ({first_line})" if first_line and not isinstance(err, (KeyboardInterrupt, Terminated)) else ""
        raise StoppedEarly(stream.stopped(stop_reason(err)) + detail, code) from None
    except failures as err:       # after the clause above: a timeout that is also a failure type stays a timeout
        if not stream.rows:
            raise
        with contextlib.suppress(Exception):
            show(stream.rows)
        raise StoppedEarly(f"{stream.stopped('stopped by a failure')}: {err}", 1) from None


def missing_folders(folder: str | Path) -> list[Path]:
    """``folder`` and the folders above it that do not exist yet, deepest first (what a mkdir would create)."""
    return [p for p in (Path(folder), *Path(folder).parents) if not p.exists()]


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` that is empty, deepest first: work that stopped early leaves no empty folder."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def read_json_lines(path: str | Path) -> list[Any]:
    """The rows a :class:`ResultStream` saved (one JSON value per line)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


class _InterruptHandler:
    """Raises KeyboardInterrupt (SIGINT) or Terminated (SIGTERM), and remembers it: Python swallows an exception
    raised while it runs a finaliser or a fork hook ("Exception ignored in ..."), and :func:`raise_if_signalled`
    then raises it again at the next safe point (a finished row)."""

    def __init__(self) -> None:
        self.pending: BaseException | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.pending = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def raise_if_signalled() -> None:
    """Raise an interrupt that arrived but was swallowed (see _InterruptHandler); nothing when there was none."""
    handler = signal.getsignal(signal.SIGTERM)
    if isinstance(handler, _InterruptHandler) and handler.pending is not None:
        pending, handler.pending = handler.pending, None
        raise pending


def forget_signal() -> None:
    """The interrupt was handled: a later safe point must not raise it again."""
    handler = signal.getsignal(signal.SIGTERM)
    if isinstance(handler, _InterruptHandler):
        handler.pending = None


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` (and Ctrl-C KeyboardInterrupt), so finished work is printed
    and kept; an interrupt Python swallowed is raised again by the next finished row (ResultStream.add)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _InterruptHandler()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
