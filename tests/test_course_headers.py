"""scripts/course_headers.py: every notebook's header gives the map's measured run time and counted reading time, and
a header left behind by a new measurement is caught."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "course_headers.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_every_header_says_what_the_map_measured():
    run = _run("--check")
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_new_measurement_makes_the_header_stale_until_it_is_rewritten(tmp_path):
    shutil.copytree(REPO / "notebooks", tmp_path / "notebooks")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| 18 |"))
    seconds = row.split("|")[-3].strip()
    (tmp_path / "README.md").write_text(readme.replace(row, row.replace(f"| {seconds} |", "| 999 s |")),
                                        encoding="utf-8")
    stale = _run("--check", "--notebooks", str(tmp_path / "notebooks"))
    assert stale.returncode == 1 and "18_one_mesh.ipynb" in stale.stdout, stale.stdout
    assert _run("--notebooks", str(tmp_path / "notebooks")).returncode == 0
    assert _run("--check", "--notebooks", str(tmp_path / "notebooks")).returncode == 0
    assert "**Time:** 999 s to run in fast mode" in (tmp_path / "notebooks" / "18_one_mesh.ipynb").read_text()
