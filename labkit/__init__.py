"""Training Performance Lab: the reusable parts behind the notebooks.

Notebooks tell the story; this package holds the instruments they call. The API is the subpackages (``__all__``):
every name has one home, imported from it, ``from labkit.core.env import pick``, as the notebooks, README and
docstrings write it, so the import graph sees every use. ``import labkit`` itself only sets up the process
(TensorFlow's log level; Triton before TensorFlow) and loads no framework, so a worker process that needs only
``labkit.comm.mpi_demos`` does not pay for torch and TensorFlow.
"""
from __future__ import annotations

# first, so a Ctrl-C or SIGTERM from here on waits for the set-up below (labkit.core.interrupts imports nothing heavy)
from labkit.core.interrupts import exit_for_signal as _exit_for_signal
from labkit.core.interrupts import signals_deferred as _signals_deferred
from labkit.core.interrupts import started_as_command as _started_as_command

import importlib.util as _importlib_util
import os as _os
import sys as _sys
import warnings as _warnings

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out of the lessons


def _fit_threads_before_torch() -> None:
    """OpenMP reads its settings once, when torch loads: fit them to this machine's CPUs now, or warn."""
    from labkit.core.machine import THREAD_ENV, fit_threads_to_machine  # lazy: keeps the API table first
    if "torch" not in _sys.modules:
        fit_threads_to_machine()
    elif any(_os.environ.get(k) != v for k, v in THREAD_ENV.items()):
        _warnings.warn("torch was imported before labkit, so its threads spin while idle and fight any other "
                       "program for the cores (slow on a busy machine): restart the kernel and `import labkit` "
                       "first", RuntimeWarning, stacklevel=3)




def _load_triton_before_tensorflow() -> None:
    """Import Triton now if TensorFlow may follow: in one process, Triton loaded *after* TensorFlow segfaults.

    torch's optimizers import Triton on their first step (CUDA builds), so a kernel that imported TensorFlow
    and then trains a torch model dies without a Python traceback. Loading Triton first costs ~7 MB and
    0.5 s, and only where both are installed (the CPU wheels Binder uses ship no Triton).
    """
    if "triton" in _sys.modules or _importlib_util.find_spec("triton") is None \
            or _importlib_util.find_spec("tensorflow") is None:
        return
    if "tensorflow" in _sys.modules:
        _warnings.warn("TensorFlow was imported before labkit: in this environment a torch optimizer step will "
                       "then crash the kernel (Triton cannot load after TensorFlow). Restart the kernel and "
                       "`import labkit` (or `import triton`) before TensorFlow.", RuntimeWarning, stacklevel=3)
        return
    import triton  # noqa: F401


def _set_up_process() -> None:
    """Fit the threads, load Triton: a Ctrl-C or SIGTERM meanwhile waits until this is done (never a half-loaded
    library), then ends the `labkit` command with its one line, or reaches a notebook as usual."""
    with _signals_deferred(_exit_for_signal if _started_as_command() else None):
        _fit_threads_before_torch()
        _load_triton_before_tensorflow()


_set_up_process()

__version__ = "0.1.0"

# the public API: one subpackage per layer of the kit (tests/test_layout.py holds their order)
__all__ = ["checkpoint", "cli", "cluster", "comm", "core", "input", "ladder", "memory", "parallel", "plan", "profile",
           "sharding", "tf", "training", "ui"]
