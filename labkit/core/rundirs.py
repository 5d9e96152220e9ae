"""Run directories for traces and profiles (torch-free, so TensorFlow-only child processes can use it)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

RUN_DIR_ENV_VAR = "LABKIT_RUN_DIR"


def run_root() -> Path:
    """Where every run's traces and reports go: ``$LABKIT_RUN_DIR``, else ``runs/`` at the repository root.

    Notebooks run with ``notebooks/`` as their working directory and the CLI with the repository root, so a
    relative ``runs/`` would split one lab's output over two folders; one root keeps them together. An installed
    (non-checkout) labkit falls back to ``./runs``.
    """
    if os.environ.get(RUN_DIR_ENV_VAR):
        return Path(os.environ[RUN_DIR_ENV_VAR]).expanduser()
    checkout = Path(__file__).resolve().parents[2]
    return checkout / "runs" if (checkout / "pyproject.toml").is_file() else Path.cwd() / "runs"


def run_path(*parts: str) -> Path:
    """A path under ``run_root()``, e.g. ``run_path("profile", "resnet18_b16")``; nothing is created."""
    return run_root().joinpath(*parts)


def check_writable_dir(run_dir: str | Path, *, name: str = "run_dir",
                       example: str = "'runs/my_experiment'") -> Path:
    """Create ``run_dir`` if needed and prove it is writable, or raise one clear PermissionError.

    ``name`` and ``example`` word the message for the caller (the CLI says ``--out`` and ``--out runs/ladder``).
    """
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_test_"):
            pass
    except OSError as err:
        raise PermissionError(f"{name}={str(path)!r} is not a writable directory ({err.strerror}); "
                              f"pass a {name} you can write to, e.g. {example}") from None
    return path
