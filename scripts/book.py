"""`make book`: run every notebook as CI runs it, keep the outputs, then build a static site from those copies.

Two steps, so no page can show an output nobody ran and no failed run can hide behind a finished site:

1. **execute** — each ``notebooks/[0-9]*.ipynb`` (picked up by file name, as ``labkit.core.notebook_map`` does: a
   notebook added later gets a page without anyone editing a list) runs in a fresh kernel of this Python, in the
   notebooks folder, cell timeout 900 s (``BOOK_CELL_TIMEOUT_S`` sets another): the way ``make nbval`` runs it (fast mode on a CPU, full where a GPU is,
   chosen by ``labkit.core.env`` as always). ``LABKIT_LESSON_LOG`` points at one log per notebook, so its page can
   show the tally and every NOT CHECKED / INCONCLUSIVE line. A cell that raises (other than one tagged
   ``raises-exception``, which nbval allows too) or outlives the cell timeout stops the build: exit 1 with one line
   naming the notebook, the cell and the error. Each notebook's kernel is shut down when that notebook ends.
2. **html** — Sphinx + MyST-NB with execution OFF renders the executed copies (outputs untouched). Each page gets
   a header cell generated from measured data: the machine (``labkit doctor``'s report), when it ran and for how
   long, the lesson tally, "open in JupyterLab" and Binder links. The front page maps the notebooks in order with a
   thumbnail of each one's key figure (the first image it printed, or the one in a cell tagged ``book-thumbnail``).

Everything is built in a hidden folder beside ``--out`` and swapped in only when complete, so an interrupted or
failed build leaves the previous book as it was (a failed notebook's partly run copy goes to ``OUT/failed/``).
Ctrl-C and SIGTERM are answered at once with one line: the running kernel and its processes are ended. A full
disk, or any other error writing the book, is one line too.

Nothing is fetched at build time or when the site is read: the theme (sphinx-book-theme) is a pip package and
MathJax 2 comes from the jupyter-server-mathjax wheel, copied into the site.

    python scripts/book.py build [--notebooks 00_start_here.ipynb ...] [--out build/book]
    python scripts/book.py execute ...   /   python scripts/book.py html --out build/book
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book_pages  # noqa: E402  (the page-writing half, next to this file)

REPO = Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 900            # nbval's --nbval-cell-timeout in `make nbval`; BOOK_CELL_TIMEOUT_S overrides it
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_SLICE_S = 0.1                  # the main thread waits in slices this short, so a signal is answered at once
_END_GRACE_S = 1.5              # a stopped kernel's processes get this long to exit on SIGTERM before SIGKILL


class NotebookFailed(RuntimeError):
    """A notebook raised while the book ran it; the message names the notebook, the cell and the error."""


class BookStopped(BaseException):
    """SIGINT or SIGTERM arrived (a BaseException, so no ``except Exception`` on the way can swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Progress:
    """Where the book is: the notebook, the cell and the nbclient client running it (None between notebooks)."""

    notebook: str = ""
    cell: int = -1
    client: Any = None


def cell_timeout_s(environ: dict | None = None) -> float:
    """``BOOK_CELL_TIMEOUT_S`` (seconds, > 0), else 900."""
    text = (os.environ if environ is None else environ).get("BOOK_CELL_TIMEOUT_S", "").strip()
    if not text:
        return CELL_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise SystemExit(f"book: BOOK_CELL_TIMEOUT_S must be a positive number of seconds, not {text!r}")
    return value


def pick_notebooks(folder: Path, names: list[str] | None) -> list[Path]:
    """Every numbered notebook in ``folder`` (file-name order), or just ``names``; a name that is not there is an error."""
    if names:
        paths = [folder / Path(n).name for n in names]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise SystemExit(f"book: no such notebook in {folder}: {', '.join(missing)}")
        return paths
    paths = sorted(folder.glob("[0-9]*.ipynb"))
    if not paths:
        raise SystemExit(f"book: no numbered notebooks in {folder}")
    return paths


def failed_cell(nb: nbformat.NotebookNode) -> tuple[int, str]:
    """(index of the code cell whose output is an untagged error, 'Name: value') of a partly run notebook."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return index, f"{out.get('ename')}: {out.get('evalue')}"
    return -1, "no error output was kept"


def current_env_kernel_class() -> type:
    """An asyncio kernel manager class for this very Python, whatever 'python3' kernel a user installed (nbval's
    --nbval-current-env does the same). Asyncio, so nbclient's cell timeout really fires (a blocking manager's
    client waits inside one call that no timeout reaches); handed over as a class, so nbclient owns each kernel
    and shuts it down when its notebook ends."""
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict   # lazy: only the execute step starts kernels
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    from labkit.core.kernels import ipc_kernel_manager

    class CurrentEnvSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    class CurrentEnvKernel(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _current_env_specs(self) -> KernelSpecManager:
            return CurrentEnvSpecs()

    return ipc_kernel_manager(CurrentEnvKernel)     # Unix sockets: no port for another process to take


def current_env_kernel() -> Any:
    """One kernel manager of :func:`current_env_kernel_class` (for a look at the kernel it would start)."""
    return current_env_kernel_class()(kernel_name="python3")


def execute_one(path: Path, out_dir: Path, timeout_s: float = CELL_TIMEOUT_S, failed_dir: Path | None = None,
                progress: Progress | None = None) -> dict:
    """Run one notebook in a fresh kernel in its own folder; write the executed copy; return when and how long.
    The kernel is shut down before this returns, whether the notebook passed or not."""
    from nbclient import NotebookClient            # lazy: only the execute step needs a kernel client
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    progress = progress if progress is not None else Progress()
    failed_dir = failed_dir if failed_dir is not None else out_dir / "failed"
    nb = nbformat.read(path, as_version=4)
    log = out_dir / "logs" / f"{path.stem}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    env = {**os.environ, "LABKIT_LESSON_LOG": str(log)}

    def on_cell_start(cell: Any, cell_index: int) -> None:
        progress.cell = cell_index

    client = NotebookClient(nb, kernel_manager_class=current_env_kernel_class(), kernel_name="python3",
                            timeout=timeout_s, allow_errors=False, on_cell_start=on_cell_start,
                            resources={"metadata": {"path": str(path.parent)}})
    progress.notebook, progress.cell, progress.client = path.name, -1, client
    started = datetime.now(timezone.utc)
    kernel_log = log.with_suffix(".kernel.log")     # the kernel's own stdout/stderr, not the cells' outputs
    try:
        with kernel_log.open("w", encoding="utf-8") as kernel_output:
            client.execute(env=env, stdout=kernel_output, stderr=kernel_output)
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
        index, error = failed_cell(nb)
        if isinstance(err, CellTimeoutError):
            index, error = progress.cell, f"still running after the cell timeout of {timeout_s:g} s, BOOK_CELL_TIMEOUT_S"
        elif isinstance(err, DeadKernelError):
            index, error = progress.cell, "the kernel died"
        failed_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, failed_dir / path.name)
        shutil.copy2(kernel_log, failed_dir / kernel_log.name)
        raise NotebookFailed(f"book: {path.name} failed in cell {index} ({error}); the partly run copy is "
                             f"{failed_dir / path.name}, the kernel's own log {kernel_log.name} beside it") from None
    finally:
        progress.client = None
    finished = datetime.now(timezone.utc)
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / "notebooks" / path.name)
    return {"notebook": path.name, "started": started.isoformat(timespec="seconds"),
            "wall_s": round((finished - started).total_seconds(), 1), "log": str(log.relative_to(out_dir))}


def in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a thread while the main thread waits in short slices: the main thread's signal handlers
    then answer SIGINT/SIGTERM at once (nbclient's event loop, run in the main thread, would take them for itself)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as err:        # noqa: B036 - handed to the main thread as it is
            box["error"] = err

    thread = threading.Thread(target=body, name="book-notebook", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(_SLICE_S)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def end_kernel(client: Any) -> None:
    """End a running notebook's kernel and every process it started (SIGTERM, then SIGKILL), its connection file and
    its sockets."""
    import psutil                                   # lazy: only a stopped book needs it

    km = getattr(client, "km", None)
    process = getattr(getattr(km, "provisioner", None), "process", None)
    if process is None:
        return
    try:
        root = psutil.Process(process.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = []
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=_END_GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=_END_GRACE_S)
    for cleanup in (km.cleanup_connection_file, km.cleanup_ipc_files):
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - best effort: the kernel is gone either way
            pass


def doctor_report() -> dict:
    """``labkit doctor --json --no-network`` from a fresh process (it loads torch; this script does not)."""
    done = subprocess.run([sys.executable, "-m", "labkit", "doctor", "--json", "--no-network"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"book: `labkit doctor --json` gave no report (exit {done.returncode}): "
                         f"{done.stderr[-1000:]}") from None


def execute_all(paths: list[Path], out_dir: Path, failed_dir: Path | None = None,
                progress: Progress | None = None) -> Path:
    """Run the notebooks in order, stop at the first failure; write runs.json (doctor + one entry per notebook)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    timeout_s = cell_timeout_s()
    runs: dict = {"notebooks": []}
    for path in paths:
        print(f"book: running {path.name} ...", flush=True)
        entry = in_worker(execute_one, path, out_dir, timeout_s, failed_dir, progress)
        print(f"book: {path.name} ran in {entry['wall_s']:.0f} s", flush=True)
        runs["notebooks"].append(entry)
    runs["doctor"] = doctor_report()          # the machine they ran on, read once they all passed
    record = out_dir / "runs.json"
    record.write_text(json.dumps(runs, indent=1), encoding="utf-8")
    return record


def build_html(out_dir: Path) -> Path:
    """Write the site's sources from the executed copies and run Sphinx (execution off); return index.html."""
    runs = json.loads((out_dir / "runs.json").read_text(encoding="utf-8"))
    src = out_dir / "src"
    book_pages.write_sources(runs, out_dir / "notebooks", src, REPO)
    html = out_dir / "html"
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "--fail-on-warning", "--keep-going",
                           "-d", str(out_dir / "doctrees"), str(src), str(html)], cwd=out_dir, timeout=900)
    if done.returncode:
        raise SystemExit(f"book: Sphinx failed (exit {done.returncode}); its messages are above")
    book_pages.link_notebooks(html, book_pages.binder_base((REPO / "README.md").read_text(encoding="utf-8")))
    return html / "index.html"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # someone else's process
        return True
    return True


def sweep_stale_stages(out: Path) -> list[str]:
    """Remove the hidden build folders of earlier books that were killed outright (SIGKILL leaves no chance to
    clean up): each folder's name carries its builder's process id, and that process is gone."""
    removed = []
    for folder in out.parent.glob(f".{out.name}.*-[0-9]*"):
        kind, _, rest = folder.name[len(out.name) + 2:].partition("-")
        pid = rest.split("-")[0]
        if kind in ("building", "old") and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


def stage_beside(out: Path) -> Path:
    """A new hidden folder next to ``out`` (same file system, so the finished build moves in with one rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_stages(out)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{os.getpid()}-", dir=out.parent))


def copy_executed(out: Path, stage: Path) -> None:
    """For the html step alone: the executed copies, logs and runs.json of the last execute step, into the stage."""
    if not (out / "runs.json").is_file():
        raise SystemExit(f"book: no executed notebooks in {out}: run `scripts/book.py execute` first")
    book_pages.copy_or_stop(str(out / "runs.json"), str(stage / "runs.json"))
    for sub in ("notebooks", "logs"):
        if (out / sub).is_dir():
            shutil.copytree(out / sub, stage / sub, copy_function=book_pages.copy_or_stop)


def publish(stage: Path, out: Path) -> None:
    """Swap the finished build in for the old one, with SIGINT/SIGTERM held so neither lands half-way."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    try:
        if out.exists():
            out.rename(old)
        stage.rename(out)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    shutil.rmtree(old, ignore_errors=True)


def write_error_line(err: BaseException) -> str:
    """A failed write (a full disk, a missing permission) in one line, however many files it hit."""
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        first = err.args[0][0]
        why = str(first[2]).split(": '")[0][:120]
        return f"book: could not write the book: {why} ({len(err.args[0])} files failed, the first {first[1]})"
    if isinstance(err, OSError):
        where = f" ({err.filename})" if err.filename else ""
        return f"book: could not write the book: {err.strerror or err}{where}"
    return f"book: could not write the book: {str(err)[:300]}"


def stopped_line(stop: BookStopped, progress: Progress, out: Path) -> str:
    """What a stopped build says: the signal, where it was, and that the last complete book is still in place."""
    name = signal.Signals(stop.signum).name
    where = f" while running {progress.notebook} (cell {progress.cell})" if progress.client is not None else ""
    return f"book: stopped by {name}{where}; {out} holds the last complete book, unchanged"


def run_steps(args: argparse.Namespace, out: Path, stage: Path, progress: Progress) -> None:
    """The chosen step(s), built in ``stage``, published to ``out`` when complete."""
    if args.step == "html":
        copy_executed(out, stage)
    if args.step in ("build", "execute"):
        execute_all(pick_notebooks(args.folder.resolve(), args.notebooks), stage, out / "failed", progress)
    if args.step in ("build", "html"):
        build_html(stage)
    publish(stage, out)
    if args.step in ("build", "html"):
        print(f"book: site at {out / 'html' / 'index.html'}")


def main(argv: list[str] | None = None) -> int:
    """The command line: build = execute + html. Returns the exit status (128 + the signal when stopped)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("build", "execute", "html"))
    parser.add_argument("--notebooks", nargs="+", metavar="NAME", help="only these notebooks (default: every one)")
    parser.add_argument("--folder", type=Path, default=REPO / "notebooks", help="where the notebooks are")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "book", help="output folder (default build/book)")
    args = parser.parse_args(argv)
    out, progress = args.out.resolve(), Progress()
    cell_timeout_s()                                  # a bad BOOK_CELL_TIMEOUT_S is refused before anything runs

    def stop(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:                      # a second Ctrl-C while stopping is not a second traceback
            signal.signal(sig, signal.SIG_IGN)
        raise BookStopped(signum)

    saved = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    stage = None
    try:
        stage = stage_beside(out)
        run_steps(args, out, stage, progress)
    except NotebookFailed as err:
        print(err, file=sys.stderr)
        return 1
    except BookStopped as err:
        if progress.client is not None:
            end_kernel(progress.client)
        print(stopped_line(err, progress, out), file=sys.stderr)
        return 128 + err.signum
    except (OSError, shutil.Error, book_pages.SiteWriteError) as err:
        print(write_error_line(err), file=sys.stderr)
        return 1
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # a stopped book leaves now: nbclient's thread and its exit hooks would only talk to the kernel just ended
    if code >= 128:
        os._exit(code)
    sys.exit(code)
