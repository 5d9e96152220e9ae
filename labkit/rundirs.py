"""Run directories for traces and profiles (torch-free, so TensorFlow-only child processes can use it)."""
from __future__ import annotations

import tempfile
from pathlib import Path


def check_writable_dir(run_dir: str | Path) -> Path:
    """Create ``run_dir`` if needed and prove it is writable, or raise one clear PermissionError."""
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_test_"):
            pass
    except OSError as err:
        raise PermissionError(f"run_dir={str(path)!r} is not a writable directory ({err.strerror}); "
                              "pass a run_dir you can write to, e.g. 'runs/my_experiment'") from None
    return path
