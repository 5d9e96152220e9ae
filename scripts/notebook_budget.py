"""Run notebooks the way CI does and record each one's wall time and peak memory.

Peak memory is sampled every 0.3 s over the kernel's whole process tree (DataLoader workers and
torch.distributed ranks included) as PSS — each shared page split among the processes that map it, so
forked workers are not counted twice — and its anonymous part (heap and tensors). PyTorch's CUDA build, the
only one installable on the CI machine, maps CUDA-only libraries (cuBLAS, NVRTC, nvJitLink, libtorch_cuda, ...)
even on a CPU; Binder installs the CPU wheel, which has none of them. So a third figure, "CPU-wheel PSS", is the
PSS less the pages of those libraries, each process's share read from /proc/PID/smaps (every 2 s, and at once
when the process grew by 16 MiB). It is an upper bound: the CUDA build's heap is larger too.

    .venv/bin/python scripts/notebook_budget.py notebooks/02_batch_size.ipynb [...]  [--markdown]

``--cgroup-mib 2048`` runs each notebook inside a memory cgroup of that size (root; ``memory_cgroup.py``), as Binder
does, and adds the group's peak charge (page cache and shared memory included) and how many processes the kernel
killed for the limit; ``--repeat N`` runs each notebook N times (a limit crossed once in N runs is crossed).
"""
from __future__ import annotations

import argparse
import os
import re
import threading
import time
from pathlib import Path

import nbformat
import psutil
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from labkit.core.clock import now_s
from labkit.core.kernels import ipc_kernel_manager
from memory_cgroup import MemoryCgroup


# mappings that exist only in PyTorch's CUDA build (the CPU wheel has none of these files)
CUDA_ONLY = re.compile(r"/site-packages/(nvidia|cuda|triton)/|/torch/lib/lib(torch_cuda|c10_cuda|caffe2_nvrtc)")
CUDA_REFRESH_S = 2.0
CUDA_GROWTH_BYTES = 16 * 1024 ** 2


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


def cuda_only_pss_bytes(smaps: str) -> int:
    """PSS of the CUDA-only libraries in one /proc/PID/smaps text (bytes)."""
    total, counting = 0, False
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if head and not head[0].endswith(":"):           # a mapping's header: address perms offset dev inode path
            counting = len(head) == 6 and bool(CUDA_ONLY.search(head[5]))
        elif counting and head[0] == "Pss:":
            total += int(head[1]) * 1024
    return total


def _short_cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[-60:]
    except psutil.Error:
        return "?"


class TreeMemory:
    """The kernel's process tree, sampled: PSS, anonymous PSS and PSS less the CUDA-only libraries (bytes)."""

    def __init__(self) -> None:
        self.cuda: dict[int, tuple[float, int, int]] = {}     # pid -> (when read, its PSS then, CUDA-only PSS)

    def _cuda_only(self, pid: int, pss: int) -> int:
        """Re-read smaps (slow) every CUDA_REFRESH_S, or at once when the process grew: a peak is never stale."""
        when, pss_then, value = self.cuda.get(pid, (-CUDA_REFRESH_S, 0, 0))
        if now_s() - when >= CUDA_REFRESH_S or pss > pss_then + CUDA_GROWTH_BYTES:
            try:
                value = cuda_only_pss_bytes(Path(f"/proc/{pid}/smaps").read_text())
            except OSError:
                value = 0
            self.cuda[pid] = (now_s(), pss, value)
        return value

    def sample(self) -> tuple[int, int, int]:
        """(PSS, anonymous PSS, CPU-wheel PSS) of every process below this one, now; ``self.last`` keeps who held
        it (pid, short command line, PSS) for the report of the peak."""
        pss = anon = cuda = 0
        self.last: list[tuple[int, str, int]] = []
        for child in psutil.Process().children(recursive=True):
            p, a = _pss_bytes(child.pid)
            pss, anon, cuda = pss + p, anon + a, cuda + (self._cuda_only(child.pid, p) if p else 0)
            self.last.append((child.pid, _short_cmdline(child), p))
        return pss, anon, pss - cuda


def run_notebook(path: Path, timeout_s: int = 900) -> dict:
    """Execute one notebook in a fresh kernel; return seconds, peak PSS and its anonymous part (bytes)."""
    nb = nbformat.read(path, as_version=4)
    peak = {"pss": 0, "anon": 0, "cpu_wheel": 0, "cell": None, "who": []}
    done, tree, running, cell_s = threading.Event(), TreeMemory(), {"cell": None, "since": 0.0}, {}

    def sample() -> None:
        while not done.is_set():
            pss, anon, cpu_wheel = tree.sample()
            if cpu_wheel > peak["cpu_wheel"]:
                peak["cell"], peak["who"] = running["cell"], sorted(tree.last, key=lambda t: -t[2])
            for key, value in (("pss", pss), ("anon", anon), ("cpu_wheel", cpu_wheel)):
                peak[key] = max(peak[key], value)
            time.sleep(0.3)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = now_s()
    try:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                       kernel_manager_class=ipc_kernel_manager(AsyncKernelManager),    # no port to lose to a rank
                       on_cell_execute=lambda cell, cell_index: running.update(cell=cell_index, since=now_s()),
                       on_cell_executed=lambda cell, cell_index, **_: cell_s.update(
                           {cell_index: now_s() - running["since"]})).execute()
        error = ""
    except Exception as err:  # noqa: BLE001 - report and go on to the next notebook
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))                      # the traceback's colours
        lines = [line for line in text.splitlines() if line.strip()] or [""]
        error = f"{type(err).__name__} in cell {running['cell']}: {lines[-1][:300]}"     # the exception's own line
    finally:
        done.set()
        sampler.join()
    return {"notebook": path.name, "seconds": now_s() - start,
            "peak_pss_bytes": peak["pss"], "peak_anon_bytes": peak["anon"],
            "peak_cpu_wheel_pss_bytes": peak["cpu_wheel"], "peak_cell": peak["cell"], "error": error,
            "peak_processes": peak["who"],
            "slowest_cells": sorted(cell_s.items(), key=lambda kv: -kv[1])[:3]}


def run_in_cgroup(path: Path, limit_mib: int | None, index: int) -> dict:
    """:func:`run_notebook`, inside a fresh memory cgroup of ``limit_mib`` when one is given."""
    if limit_mib is None:
        return run_notebook(path)
    with MemoryCgroup(limit_mib * 1024 ** 2, name=f"labkit-budget-{os.getpid()}-{index}") as group:
        r = run_notebook(path)
        return {**r, "cgroup_peak_bytes": group.peak_bytes(), "oom_kills": group.oom_kills()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print README table rows")
    parser.add_argument("--cgroup-mib", type=int, default=None, help="run each notebook under this memory limit")
    parser.add_argument("--repeat", type=int, default=1, help="runs per notebook")
    parser.add_argument("--who", action="store_true", help="list the processes that held the peak")
    args = parser.parse_args()
    if args.repeat < 1 or (args.cgroup_mib is not None and args.cgroup_mib < 64):
        parser.error("--repeat must be >= 1 and --cgroup-mib >= 64")
    for index, path in enumerate(p for p in args.notebooks for _ in range(args.repeat)):
        r = run_in_cgroup(path, args.cgroup_mib, index)
        mib = 1024 ** 2
        group = (f"; cgroup {args.cgroup_mib} MiB: peak {r['cgroup_peak_bytes'] / mib:,.0f} MiB, "
                 f"{r['oom_kills']} OOM kill(s)") if args.cgroup_mib else ""
        if args.markdown:
            print(f"| `{r['notebook']}` | {r['seconds']:.0f} s | {r['peak_cpu_wheel_pss_bytes'] / mib:,.0f} MiB "
                  f"({r['peak_pss_bytes'] / mib:,.0f} MiB, {r['peak_anon_bytes'] / mib:,.0f} MiB) | "
                  f"{r['error'] or 'ok'} |", flush=True)
        else:
            print(f"{r['notebook']}: {r['seconds']:.1f} s, peak PSS {r['peak_pss_bytes'] / mib:,.0f} MiB, "
                  f"CPU-wheel PSS {r['peak_cpu_wheel_pss_bytes'] / mib:,.0f} MiB, anonymous "
                  f"{r['peak_anon_bytes'] / mib:,.0f} MiB (peak in cell {r['peak_cell']}); slowest cells "
                  f"{', '.join(f'{i}: {t:.0f} s' for i, t in r['slowest_cells'])}{group}; {r['error'] or 'ok'}",
                  flush=True)
        if args.who:
            for pid, cmd, pss in r["peak_processes"]:
                print(f"    {pss / mib:7,.0f} MiB  pid {pid}  {cmd}", flush=True)


if __name__ == "__main__":
    main()
