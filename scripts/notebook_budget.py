"""Run notebooks the way CI does and record each one's wall time and peak memory.

Peak memory is sampled every 0.3 s over the kernel's whole process tree (DataLoader workers and
torch.distributed ranks included) as PSS — each shared page split among the processes that map it, so
forked workers are not counted twice — and its anonymous part (heap and tensors). Shared-library pages are
large for torch's CUDA build (~430 MB per process) and much smaller for the CPU wheel Binder installs.

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

from labkit.core.clock import now_s


def _pss_bytes(pid: int) -> tuple[int, int]:
    """(PSS, anonymous PSS) of one process from /proc/PID/smaps_rollup."""
    pss = anon = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
            elif line.startswith("Pss_Anon:"):
                anon = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss, anon


def _tree_memory() -> tuple[int, int]:
    pss = anon = 0
    for child in psutil.Process().children(recursive=True):
        p, a = _pss_bytes(child.pid)
        pss, anon = pss + p, anon + a
    return pss, anon


def run_notebook(path: Path, timeout_s: int = 900) -> dict:
    """Execute one notebook in a fresh kernel; return seconds, peak PSS and its anonymous part (bytes)."""
    nb = nbformat.read(path, as_version=4)
    peak = {"pss": 0, "anon": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pss, anon = _tree_memory()
            peak["pss"], peak["anon"] = max(peak["pss"], pss), max(peak["anon"], anon)
            time.sleep(0.3)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = now_s()
    try:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        error = ""
    except Exception as err:  # noqa: BLE001 - report and go on to the next notebook
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    finally:
        done.set()
        sampler.join()
    return {"notebook": path.name, "seconds": now_s() - start,
            "peak_pss_bytes": peak["pss"], "peak_anon_bytes": peak["anon"], "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print README table rows")
    args = parser.parse_args()
    for path in args.notebooks:
        r = run_notebook(path)
        mib = 1024 ** 2
        if args.markdown:
            print(f"| `{r['notebook']}` | {r['seconds']:.0f} s | {r['peak_pss_bytes'] / mib:,.0f} MiB "
                  f"({r['peak_anon_bytes'] / mib:,.0f} MiB anon) | {r['error'] or 'ok'} |")
        else:
            print(f"{r['notebook']}: {r['seconds']:.1f} s, peak PSS {r['peak_pss_bytes'] / mib:,.0f} MiB "
                  f"(anonymous {r['peak_anon_bytes'] / mib:,.0f} MiB) {r['error'] or 'ok'}", flush=True)


if __name__ == "__main__":
    main()
