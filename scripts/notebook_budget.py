"""Run notebooks the way CI does and record each one's wall time and peak memory.

Peak memory is sampled every 0.2 s over the kernel's whole process tree (worker processes included):
RSS, and its anonymous part (RssAnon: heap/tensors, what a Binder memory limit squeezes first; the rest is
shared-library pages, large for torch's CUDA build and much smaller for the CPU wheel Binder installs).

    .venv/bin/python scripts/notebook_budget.py notebooks/02_batch_size.ipynb [...]  [--markdown]
"""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient


def _anon_bytes(proc: psutil.Process) -> int:
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_memory() -> tuple[int, int]:
    rss = anon = 0
    for child in psutil.Process().children(recursive=True):
        try:
            rss += child.memory_info().rss
            anon += _anon_bytes(child)
        except psutil.Error:
            continue
    return rss, anon


def run_notebook(path: Path, timeout_s: int = 900) -> dict:
    """Execute one notebook in a fresh kernel; return seconds, peak RSS and peak anonymous RSS (bytes)."""
    nb = nbformat.read(path, as_version=4)
    peak = {"rss": 0, "anon": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, anon = _tree_memory()
            peak["rss"], peak["anon"] = max(peak["rss"], rss), max(peak["anon"], anon)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        error = ""
    except Exception as err:  # noqa: BLE001 - report and go on to the next notebook
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    finally:
        done.set()
        sampler.join()
    return {"notebook": path.name, "seconds": time.perf_counter() - start,
            "peak_rss_bytes": peak["rss"], "peak_anon_bytes": peak["anon"], "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print README table rows")
    args = parser.parse_args()
    for path in args.notebooks:
        r = run_notebook(path)
        mb = 1024 ** 2
        if args.markdown:
            print(f"| `{r['notebook']}` | {r['seconds']:.0f} s | {r['peak_rss_bytes'] / mb:,.0f} MB "
                  f"({r['peak_anon_bytes'] / mb:,.0f} MB anon) | {r['error'] or 'ok'} |")
        else:
            print(f"{r['notebook']}: {r['seconds']:.1f} s, peak RSS {r['peak_rss_bytes'] / mb:,.0f} MB "
                  f"(anonymous {r['peak_anon_bytes'] / mb:,.0f} MB) {r['error'] or 'ok'}", flush=True)


if __name__ == "__main__":
    main()
