"""Run one labkit function in a fresh Python process and bring its JSON result back.

TensorFlow fixes its devices and thread pools once per process, and TensorFlow plus PyTorch in one kernel
is heavy (Binder has 2 GB), so TF experiments run in children. The child loads only the named labkit
module (a bare ``labkit`` package object stands in for ``labkit/__init__``), never PyTorch unless that
module imports it. Torch-free, like the TF-side modules that use it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from labkit.core.clock import now_s

_RESULT_TAG = "@@LABKIT_RESULT@@"
_CHILD_CODE = (
    "import importlib, json, sys, types\n"
    "pkg = types.ModuleType('labkit'); pkg.__path__ = [sys.argv[1]]; sys.modules['labkit'] = pkg\n"
    "mod, _, fn = sys.argv[2].partition(':')\n"
    "try:\n"
    "    out = getattr(importlib.import_module(mod), fn)(**json.loads(sys.argv[3]))\n"
    "except (ValueError, TypeError, RuntimeError) as err:\n"
    "    out = {'__error__': type(err).__name__, 'message': str(err)}\n"
    f"print({_RESULT_TAG!r} + json.dumps(out), flush=True)\n"
)


def tensorflow_missing_reason() -> str | None:
    """None when TensorFlow can be imported here; otherwise the one line a skipped TF lesson or test prints."""
    if importlib.util.find_spec("tensorflow") is not None:
        return None
    return ("TensorFlow is not installed in this environment: `.venv/bin/pip install tensorflow-cpu==2.21.*` "
            "(or `tensorflow[and-cuda]==2.21.*` on a GPU box) to run the TensorFlow half")


def tensorflow_lessons_can_run(log: Any, *claims: str) -> bool:
    """True where TensorFlow is installed; otherwise each claim is marked ``NOT CHECKED`` with the reason.

    A notebook's TensorFlow cell reads ``if tensorflow_lessons_can_run(log, "claim"): ...``, so on a box
    without TensorFlow (often a GPU box) the cell says visibly what it did not check instead of failing.
    ``log`` is a ``labkit.core.lessons.LessonLog``.
    """
    reason = tensorflow_missing_reason()
    if reason is None:
        return True
    log.not_checked_all(claims, reason)
    return False


def parse_target(target: str, what: str = "a function given by name", package: str = "") -> tuple[str, str]:
    """('package.module', 'function') from a target written 'package.module:function' (inside ``package`` when
    one is given); anything else is one clear error that shows the form."""
    module, sep, func = target.partition(":")
    if not sep or not module or not func or (package and not module.startswith(package + ".")):
        raise ValueError(f"{what} must read '{package or 'package'}.module:function', got {target!r}")
    return module, func


def run_in_fresh_process(target: str, kwargs: dict | None = None, *, timeout_s: float = 300.0,
                         env: dict | None = None, errors: dict[str, type[Exception]] | None = None) -> Any:
    """Run ``labkit.module:function(**kwargs)`` in a new Python process and return its JSON result.

    A ValueError or TypeError in the child (or an error type named in ``errors``) is raised here with the
    same type and message; a crash, a missing result or a timeout (the child is killed) raise clearly.
    """
    parse_target(target, "target", package="labkit")
    known = {"ValueError": ValueError, "TypeError": TypeError, **(errors or {})}
    # TF_FORCE_GPU_ALLOW_GROWTH: a TensorFlow child on a GPU box takes GPU memory as it needs it, instead of
    # reserving most of the card under the notebook kernel's PyTorch tensors
    child_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_FORCE_GPU_ALLOW_GROWTH": "true", "PYTHONUNBUFFERED": "1",
                 **(env or {})}
    start = now_s()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD_CODE, str(Path(__file__).resolve().parents[1]), target,
                               json.dumps(kwargs or {})], capture_output=True, text=True, timeout=timeout_s,
                              env=child_env)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{target} did not finish within timeout_s={timeout_s:g} s; the process was "
                           "killed (raise timeout_s on a slow machine)") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-8:]
        raise RuntimeError(f"{target} failed in its child process (exit {proc.returncode}):\n" + "\n".join(tail))
    result = json.loads(lines[-1][len(_RESULT_TAG):])
    if isinstance(result, dict) and "__error__" in result:
        raise known.get(result["__error__"], RuntimeError)(result["message"])
    if isinstance(result, dict):
        result.setdefault("child_wall_s", now_s() - start)
    return result


def _probe_modules() -> dict:
    """Test hook: which heavy modules the child has loaded."""
    return {"torch": "torch" in sys.modules, "tensorflow": "tensorflow" in sys.modules}
