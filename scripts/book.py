"""`make book`: run every notebook as CI runs it, keep the outputs, then build a static site from those copies.

Two steps, so no page can show an output nobody ran and no failed run can hide behind a finished site:

1. **execute** — each ``notebooks/[0-9]*.ipynb`` (picked up by file name, as ``labkit.core.notebook_map`` does: a
   notebook added later gets a page without anyone editing a list) runs in a fresh kernel of this Python, in the
   notebooks folder, cell timeout 900 s: the way ``make nbval`` runs it (fast mode on a CPU, full where a GPU is,
   chosen by ``labkit.core.env`` as always). ``LABKIT_LESSON_LOG`` points at one log per notebook, so its page can
   show the tally and every NOT CHECKED / INCONCLUSIVE line. A cell that raises (other than one tagged
   ``raises-exception``, which nbval allows too) stops the build: exit 1 with the notebook, the cell and the error.
2. **html** — Sphinx + MyST-NB with execution OFF renders the executed copies (outputs untouched). Each page gets
   a header cell generated from measured data: the machine (``labkit doctor``'s report), when it ran and for how
   long, the lesson tally, "open in JupyterLab" and Binder links. The front page maps the notebooks in order with a
   thumbnail of each one's key figure (the first image it printed, or the one in a cell tagged ``book-thumbnail``).

Nothing is fetched at build time or when the site is read: the theme (sphinx-book-theme) is a pip package and
MathJax 2 comes from the jupyter-server-mathjax wheel, copied into the site.

    python scripts/book.py build [--notebooks 00_start_here.ipynb ...] [--out build/book]
    python scripts/book.py execute ...   /   python scripts/book.py html --out build/book
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book_pages  # noqa: E402  (the page-writing half, next to this file)

REPO = Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 900            # nbval's --nbval-cell-timeout in `make nbval`


class NotebookFailed(RuntimeError):
    """A notebook raised while the book ran it; the message names the notebook, the cell and the error."""


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


def current_env_kernel():
    """A kernel manager for this very Python, whatever 'python3' kernel a user installed (nbval's
    --nbval-current-env does the same), so the book runs the notebooks in the lab's venv."""
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict   # lazy: only the execute step starts kernels
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class CurrentEnvSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    return KernelManager(kernel_spec_manager=CurrentEnvSpecs(), kernel_name="python3")


def execute_one(path: Path, out_dir: Path, timeout_s: int = CELL_TIMEOUT_S) -> dict:
    """Run one notebook in a fresh kernel in its own folder; write the executed copy; return when and how long."""
    from nbclient import NotebookClient            # lazy: only the execute step needs a kernel client
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(path, as_version=4)
    log = out_dir / "logs" / f"{path.stem}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    env = {**os.environ, "LABKIT_LESSON_LOG": str(log)}
    client = NotebookClient(nb, km=current_env_kernel(), timeout=timeout_s, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    started = datetime.now(timezone.utc)
    try:
        client.execute(env=env)
    except (CellExecutionError, CellTimeoutError) as err:
        index, error = failed_cell(nb)
        if isinstance(err, CellTimeoutError):
            error = f"cell timed out after {timeout_s} s"
        (out_dir / "failed").mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / "failed" / path.name)
        raise NotebookFailed(f"book: {path.name} failed in cell {index} ({error}); the partly run copy is "
                             f"{out_dir / 'failed' / path.name}") from None
    finished = datetime.now(timezone.utc)
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / "notebooks" / path.name)
    return {"notebook": path.name, "started": started.isoformat(timespec="seconds"),
            "wall_s": round((finished - started).total_seconds(), 1), "log": str(log)}


def doctor_report() -> dict:
    """``labkit doctor --json --no-network`` from a fresh process (it loads torch; this script does not)."""
    done = subprocess.run([sys.executable, "-m", "labkit", "doctor", "--json", "--no-network"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"book: `labkit doctor --json` gave no report (exit {done.returncode}): "
                         f"{done.stderr[-1000:]}") from None


def execute_all(paths: list[Path], out_dir: Path) -> Path:
    """Run the notebooks in order, stop at the first failure; write runs.json (doctor + one entry per notebook)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict = {"notebooks": []}
    for path in paths:
        print(f"book: running {path.name} ...", flush=True)
        entry = execute_one(path, out_dir)
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


def main(argv: list[str] | None = None) -> int:
    """The command line: build = execute + html."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("build", "execute", "html"))
    parser.add_argument("--notebooks", nargs="+", metavar="NAME", help="only these notebooks (default: every one)")
    parser.add_argument("--folder", type=Path, default=REPO / "notebooks", help="where the notebooks are")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "book", help="output folder (default build/book)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    try:
        if args.step in ("build", "execute"):
            execute_all(pick_notebooks(args.folder.resolve(), args.notebooks), out)
        if args.step in ("build", "html"):
            print(f"book: site at {build_html(out)}")
    except NotebookFailed as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
