"""scripts/memory_cgroup.py (notebook_budget --cgroup-mib): a child that outgrows the limit is killed and counted,
one that stays under it is not, and the group is gone afterwards."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from memory_cgroup import ROOT, MemoryCgroup  # noqa: E402

BASE = ROOT if (ROOT / "cgroup.controllers").exists() else ROOT / "memory"
needs_cgroup = pytest.mark.skipif(not os.access(BASE, os.W_OK), reason="needs root and a writable memory cgroup")
GROW = "b = bytearray({n} * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('held')"


@needs_cgroup
def test_a_child_past_the_limit_is_killed_and_counted_one_under_it_is_not():
    with MemoryCgroup(192 * 1024 ** 2, name=f"labkit-test-{os.getpid()}") as group:
        small = subprocess.run([sys.executable, "-c", GROW.format(n=32)], capture_output=True, timeout=60)
        assert small.returncode == 0 and group.oom_kills() == 0
        assert 32 * 1024 ** 2 <= group.peak_bytes()
        big = subprocess.run([sys.executable, "-c", GROW.format(n=400)], capture_output=True, timeout=60)
        assert big.returncode == -9 and group.oom_kills() == 1          # SIGKILL from the kernel, counted
        path = group.path
    assert not path.exists()                                            # this process moved back, the group gone


def test_a_bad_limit_is_one_line():
    with pytest.raises(ValueError, match="limit_bytes must be > 0"):
        MemoryCgroup(0)
