"""The Makefile's nbval target: the lesson total prints even when a notebook fails, and the failure still fails make."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Stands in for the venv's python: "pytest" (nbval) exits with NBVAL_RC, "-m labkit.core.lessons" prints a total.
FAKE_PYTHON = """#!/bin/sh
if [ "$2" = pytest ]; then echo "nbval ran"; exit "$NBVAL_RC"; fi
echo "lessons total from $3"
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("nbval_rc", [0, 3])
def test_nbval_prints_the_lesson_total_and_keeps_nbvals_exit_status(tmp_path, nbval_rc):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    done = subprocess.run(["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "-o", "install", "nbval",
                           f"PY={fake}"], env={"PATH": "/usr/bin:/bin", "NBVAL_RC": str(nbval_rc)},
                          capture_output=True, text=True, timeout=60)
    assert "nbval ran" in done.stdout
    assert f"lessons total from {tmp_path / 'runs' / 'lessons.jsonl'}" in done.stdout
    if nbval_rc:
        assert done.returncode == 2 and "nbval] Error 3" in done.stderr  # make's own status for a failed recipe
    else:
        assert done.returncode == 0


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_install_puts_binders_jupyterlab_overrides_into_the_venv(tmp_path):
    """`make lab` opens without the "get notified about Jupyter news?" pop-up: install copies the overrides."""
    venv = tmp_path / "venv"
    stamp = venv / ".installed-mpi"
    stamp.parent.mkdir(parents=True)
    stamp.touch()
    done = subprocess.run(["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "-o", str(stamp),
                           "install", f"VENV={venv}"], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installed = venv / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings = json.loads(installed.read_text())
    assert settings == json.loads((REPO / "binder" / "overrides.json").read_text())
    assert settings["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
