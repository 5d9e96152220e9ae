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


# Stands in for the venv's python during `make install`: logs each call and what pip read on stdin.
LOGGING_PYTHON = """#!/bin/sh
echo "$@" >> "$CALLS"
case "$*" in *"-r /dev/stdin"*) cat >> "$CALLS";; esac
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("nvidia_smi,override,expected", [
    (False, None, "cpu"), (True, None, "gpu"),          # by default the build follows the driver
    (True, "cpu", "cpu"), (False, "gpu", "gpu"),        # TF_BUILD overrides it either way
])
def test_install_picks_tensorflows_gpu_build_only_where_nvidia_smi_is(tmp_path, nvidia_smi, override, expected):
    """CPU, Binder and CI keep requirements.txt's tensorflow-cpu; a box with an NVIDIA driver gets the CUDA build."""
    (tmp_path / "requirements.txt").write_text("torch==2.14.1\ntensorflow-cpu==2.21.*\nnumpy>=1.26\n")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "venv").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text(LOGGING_PYTHON)
    fake.chmod(0o755)
    if nvidia_smi:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    calls = tmp_path / "calls.txt"
    done = subprocess.run(["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "install", f"PY={fake}",
                           f"VENV={tmp_path / 'venv'}", *([f"TF_BUILD={override}"] if override else [])],
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    log = calls.read_text()
    if expected == "gpu":
        assert "uninstall -q -y tensorflow-cpu" in log and '-r /dev/stdin tensorflow[and-cuda]==2.21.* -e .[mpi]' in log
        assert "torch==2.14.1" in log and "numpy>=1.26" in log and "tensorflow-cpu==" not in log   # the rest, as pinned
        assert (tmp_path / "venv" / ".installed-mpi-tfgpu").exists()
    else:
        assert "-r requirements.txt -e .[mpi]" in log and "and-cuda" not in log and "uninstall" not in log
        assert (tmp_path / "venv" / ".installed-mpi-tfcpu").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_install_puts_binders_jupyterlab_overrides_into_the_venv(tmp_path):
    """`make lab` opens without the "get notified about Jupyter news?" pop-up: install copies the overrides."""
    venv = tmp_path / "venv"
    stamp = venv / ".installed-mpi-tfcpu"   # no nvidia-smi on this PATH: the CPU build
    stamp.parent.mkdir(parents=True)
    stamp.touch()
    done = subprocess.run(["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "-o", str(stamp),
                           "install", f"VENV={venv}"], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installed = venv / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings = json.loads(installed.read_text())
    assert settings == json.loads((REPO / "binder" / "overrides.json").read_text())
    assert settings["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("book_rc", [0, 1])
def test_book_runs_the_book_script_and_fails_when_it_fails(tmp_path, book_rc):
    """`make book` = scripts/book.py build (every notebook, or BOOK_NOTEBOOKS); a failed notebook fails make."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "book called with: $*"\nexit "$BOOK_RC"\n')
    fake.chmod(0o755)
    done = subprocess.run(["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "-o", "install", "book",
                           f"PY={fake}", "BOOK_NOTEBOOKS=00_a.ipynb 01_b.ipynb"],
                          env={"PATH": "/usr/bin:/bin", "BOOK_RC": str(book_rc)},
                          capture_output=True, text=True, timeout=60)
    assert "book called with: scripts/book.py build --out build/book --notebooks 00_a.ipynb 01_b.ipynb" in done.stdout
    assert done.returncode == (2 if book_rc else 0), done.stderr
