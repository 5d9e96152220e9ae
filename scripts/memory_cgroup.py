"""A memory cgroup around this process and everything it starts: Binder's 2 GiB limit, enforced by the kernel.

PSS (what ``notebook_budget.py`` samples) says how much a notebook uses; a cgroup says whether the kernel would kill
it under a limit, counting what PSS does not (page cache the notebook's files fill, shared memory, kernel memory)
and reclaiming what it can before it kills. Linux only, as root; cgroup v2 (``memory.max``, ``memory.peak``,
``memory.events``) or v1 (``memory.limit_in_bytes``, ``memory.max_usage_in_bytes``, ``memory.oom_control``).
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


class MemoryCgroup:
    """``with MemoryCgroup(limit_bytes) as cg:`` moves this process into a new memory cgroup (children inherit it);
    ``cg.peak_bytes()`` and ``cg.oom_kills()`` read it; leaving moves the process back and removes the group.
    Enter it from a small process only: the kernel's OOM killer picks the largest process in the group."""

    def __init__(self, limit_bytes: int, name: str | None = None) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be > 0, got {limit_bytes}")
        self.limit_bytes, self.name = limit_bytes, name or f"labkit-budget-{os.getpid()}"
        self.v2 = (ROOT / "cgroup.controllers").exists()
        base = ROOT if self.v2 else ROOT / "memory"
        if not os.access(base, os.W_OK):
            raise PermissionError(f"cannot create a memory cgroup under {base}: run as root (or without --cgroup-mib)")
        self.path, self.parent_procs = base / self.name, base / "cgroup.procs"

    def __enter__(self) -> "MemoryCgroup":
        self.path.mkdir()
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(self.limit_bytes))
        if not self.v2 and (self.path / "memory.memsw.limit_in_bytes").exists():
            (self.path / "memory.memsw.limit_in_bytes").write_text(str(self.limit_bytes))   # no escape to swap
        (self.path / "cgroup.procs").write_text(str(os.getpid()))
        return self

    def reset_peak(self) -> None:
        """Start the peak again (v1 only: v2's memory.peak cannot be reset before kernel 6.12)."""
        if not self.v2:
            (self.path / "memory.max_usage_in_bytes").write_text("0")

    def peak_bytes(self) -> int:
        """The group's highest charge since it was made (or reset): anonymous memory, page cache, shared memory."""
        return int((self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")).read_text())

    def oom_kills(self) -> int:
        """How many processes the kernel killed for this group's limit."""
        text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)

    def __exit__(self, *exc: object) -> None:
        self.parent_procs.write_text(str(os.getpid()))
        for pid in (self.path / "cgroup.procs").read_text().split():     # a leftover child: move it out too
            try:
                self.parent_procs.write_text(pid)
            except OSError:
                pass
        self.path.rmdir()
