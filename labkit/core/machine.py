"""Facts about this machine: cores, memory, installed packages. Torch-free, so TensorFlow-only child
processes size their thread pools with the same core count as the rest of the kit.
"""
from __future__ import annotations

import importlib
import os
from importlib import metadata

import psutil


def cpu_count() -> int:
    """Cores this process may use (respects affinity masks, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def total_ram_bytes() -> int:
    """Physical memory of the machine."""
    return int(psutil.virtual_memory().total)


def package_version(name: str) -> str | None:
    """Installed version of a package, or None when it is missing."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def module_importable(module: str) -> bool:
    """True when ``import module`` works."""
    try:
        importlib.import_module(module)
        return True
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return False
