"""scripts/memory_cgroup.py (notebook_budget --cgroup-mib): a child that outgrows the limit is killed and counted,
one that stays under it is not, and the group is gone afterwards.

The group is entered by a small driver process, never by the test process: the kernel's OOM killer picks the
largest process in the group, and a pytest worker (gigabytes after a few hundred tests) would be the one killed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
from memory_cgroup import ROOT, MemoryCgroup  # noqa: E402

BASE = ROOT if (ROOT / "cgroup.controllers").exists() else ROOT / "memory"
needs_cgroup = pytest.mark.skipif(not os.access(BASE, os.W_OK), reason="needs root and a writable memory cgroup")
GROW = "b = bytearray({n} * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('held')"
DRIVER = """
import json, subprocess, sys
sys.path.insert(0, {scripts!r})
from memory_cgroup import MemoryCgroup
grow = {grow!r}
with MemoryCgroup(192 * 1024 ** 2, name={name!r}) as group:
    small = subprocess.run([sys.executable, "-c", grow.format(n=32)], capture_output=True).returncode
    after_small, peak = group.oom_kills(), group.peak_bytes()
    big = subprocess.run([sys.executable, "-c", grow.format(n=400)], capture_output=True).returncode
    out = dict(small=small, after_small=after_small, peak=peak, big=big, after_big=group.oom_kills(),
               path=str(group.path))
print(json.dumps(out))
"""


@needs_cgroup
def test_a_child_past_the_limit_is_killed_and_counted_one_under_it_is_not():
    name = f"labkit-test-{os.getpid()}"
    done = subprocess.run([sys.executable, "-c", DRIVER.format(scripts=str(SCRIPTS), grow=GROW, name=name)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["small"] == 0 and got["after_small"] == 0 and got["peak"] >= 32 * 1024 ** 2
    assert got["big"] == -9 and got["after_big"] == 1                # SIGKILL from the kernel, counted
    assert not Path(got["path"]).exists()                              # the driver moved back, the group gone


def test_a_bad_limit_is_one_line():
    with pytest.raises(ValueError, match="limit_bytes must be > 0"):
        MemoryCgroup(0)
