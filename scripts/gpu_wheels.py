"""`make gpu-wheels`: download, here, the wheels a lent GPU box lacks, so `make gpu-check` runs there with no registry.

A lent GPU machine reaches nothing outside it; its image has Python 3.12 with torch, numpy, pandas, matplotlib,
psutil, pytest and NVML's bindings, but no Jupyter kernel, nbval or ipywidgets (notebooks cannot run under nbval
without them). This resolves those packages with every dependency for that interpreter and platform into `.whl/`
(about 20 MB, ignored by git); carry `.whl/` to the box, and `scripts/gpu_check.py` installs the ones its Python
lacks into the run folder, never over its own packages. TensorFlow (over 600 MB) is left out: its lessons say NOT
CHECKED there, with the reason.

    .venv/bin/python scripts/gpu_wheels.py                      # for the lent image's CPython 3.12
    .venv/bin/python scripts/gpu_wheels.py --python-version 3.11
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("nbval", "ipykernel", "ipywidgets", "nbformat", "jupyter_client")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64")


def download_command(dest: Path, python_version: str) -> list[str]:
    """pip's download of PACKAGES and their dependencies as wheels for ``python_version`` on x86-64 Linux."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", python_version,
            "--implementation", "cp", *platforms, "-d", str(dest), *PACKAGES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".whl")
    parser.add_argument("--python-version", default="3.12", help="the lent image's CPython (default 3.12)")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(download_command(args.dest, args.python_version), timeout=900)
    if done.returncode:
        print(f"pip could not download the wheels (exit {done.returncode}): is a package registry reachable?",
              file=sys.stderr)
        return 1
    wheels = sorted(args.dest.glob("*.whl"))
    size_mb = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size_mb:.0f} MiB in {args.dest}: carry this folder to the GPU box")
    return 0


if __name__ == "__main__":
    sys.exit(main())
