"""Real faults for the tests of issue 29: a tiny tmpfs filled to the last byte (ENOSPC) or remounted read-only
(EROFS), where root may mount; else the caller falls back to a monkeypatched write that raises the same errno."""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def tiny_tmpfs(tmp_path: Path, size: str = "128k") -> Iterator[Path | None]:
    """A fresh tmpfs of ``size`` mounted under ``tmp_path`` (None where mounting is not allowed); always unmounted."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, timeout=30)
    if proc.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def fill(mount: Path) -> None:
    """Write zeros into ``mount`` until the file system reports ENOSPC."""
    with contextlib.suppress(OSError), open(mount / "filler", "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)


def remount_read_only(mount: Path) -> bool:
    """Remount the tmpfs read-only (EROFS on every write); False where that is not allowed."""
    return subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True, timeout=30).returncode == 0


def raise_enospc(*args: object, **kwargs: object) -> None:
    """A stand-in for a write on a full disk."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
