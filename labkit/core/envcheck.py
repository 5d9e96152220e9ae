"""The kit's environment variables, checked in one place before any work starts (torch-free).

A value the kit does not understand is refused by every command alike, with a message that names the variable;
``labkit doctor`` lists the same problems. Launcher variables (``RANK``, ``WORLD_SIZE``, ``MASTER_*``) left over
in a shell are recognised before a process starts: torchrun marks its ranks with ``TORCHELASTIC_RUN_ID`` and MPI
launchers with their own rank variables, so torch-style variables without either are stale.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Mapping

MODE_VAR, MODES = "LABKIT_MODE", ("fast", "full")
RUN_DIR_VAR, DATA_DIR_VAR, DATASET_VAR = "LABKIT_RUN_DIR", "LABKIT_DATA_DIR", "LABKIT_DATASET"
OFFLINE_VAR, LESSON_LOG_VAR = "LABKIT_OFFLINE", "LABKIT_LESSON_LOG"
DATASET_NAMES = ("auto", "cifar10", "digits", "synthetic")
OFFLINE_VALUES = ("", "0", "1", "true", "false", "yes", "no")
TORCH_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LAUNCHER_MARKS = ("TORCHELASTIC_RUN_ID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK")


class EnvironmentProblem(ValueError):
    """An environment variable holds a value the kit cannot use; the message names it and says what to do."""


def checked_mode_name(environ: Mapping[str, str]) -> str:
    """``$LABKIT_MODE`` lower-cased ('' when unset), or one EnvironmentProblem naming the variable."""
    forced = environ.get(MODE_VAR, "").strip().lower()
    if forced and forced not in MODES:
        raise EnvironmentProblem(f"{MODE_VAR} must be one of {MODES} (or unset for automatic), got {forced!r}; "
                                 f"`export {MODE_VAR}=fast` or `unset {MODE_VAR}`")
    return forced


def writable_place_problem(path: Path) -> str:
    """'' when ``path`` is (or can be created as) a writable folder, else why not; proven by writing, and any
    folder created for the proof is removed again (a check must not leave an empty folder behind)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return f"cannot be created ({existing} is a file)"
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as err:
        return f"{'is not writable' if not created else 'cannot be created'} ({err.strerror or err})"
    finally:
        for folder in created:              # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
    return ""


def _path_problems(environ: Mapping[str, str]) -> list[str]:
    """Run dir: must be (or become) a writable folder. Data dir: only emptiness here; labkit.core.data.check_data_dir
    says what is wrong with a folder that is missing or lacks its manifest (naming the variable), so it is said once."""
    problems = []
    for var, what in ((RUN_DIR_VAR, "the folder for traces and reports"), (DATA_DIR_VAR, "the data folder")):
        if var in environ and not environ[var].strip():
            problems.append(f"{var} is set but empty; unset it or name {what}")
    run_dir = environ.get(RUN_DIR_VAR, "").strip()
    why = writable_place_problem(Path(run_dir).expanduser()) if run_dir else ""
    if why:
        problems.append(f"{RUN_DIR_VAR}={run_dir} {why}; point {RUN_DIR_VAR} at a folder you can write to, "
                        "or unset it")
    log = environ.get(LESSON_LOG_VAR, "").strip()
    if log:
        parent = Path(log).expanduser().parent
        if Path(log).is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK):
            problems.append(f"{LESSON_LOG_VAR}={log} is not a file the kit can append to (its folder must exist "
                            "and be writable); fix the path or unset it")
    return problems


def _value_problems(environ: Mapping[str, str]) -> list[str]:
    problems = []
    try:
        checked_mode_name(environ)
    except EnvironmentProblem as err:
        problems.append(str(err))
    dataset = environ.get(DATASET_VAR, "").strip().lower()
    if dataset and dataset not in DATASET_NAMES:
        problems.append(f"{DATASET_VAR} must be one of {DATASET_NAMES}, got {dataset!r}; fix it or unset it")
    if environ.get(OFFLINE_VAR, "").strip().lower() not in OFFLINE_VALUES:
        problems.append(f"{OFFLINE_VAR} must be 1 (offline) or 0, got {environ[OFFLINE_VAR]!r}")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        text = environ.get(var, "").strip()
        if text and not (text.isdigit() and (var != "MASTER_PORT" or 1 <= int(text) <= 65535)):
            problems.append(f"{var}={text!r} is not a {'port (1-65535)' if var == 'MASTER_PORT' else 'whole number'}; "
                            f"unset {var} unless a launcher set it")
    return problems


def stale_launcher_variables(environ: Mapping[str, str]) -> list[str]:
    """The torch launcher variables set in this shell although no launcher started this process ([] if none)."""
    if any(environ.get(mark) for mark in LAUNCHER_MARKS):
        return []
    return [var for var in TORCH_LAUNCH_VARS if environ.get(var)]


def environment_problems(environ: Mapping[str, str] | None = None, command: str | None = None) -> list[str]:
    """Every problem with the kit's variables, one line each ([] when all is well); `launch` also checks staleness."""
    environ = os.environ if environ is None else environ
    problems = _value_problems(environ) + _path_problems(environ)
    stale = stale_launcher_variables(environ)
    if command == "launch" and stale and not problems and any(v in stale for v in ("RANK", "WORLD_SIZE")):
        shown = " ".join(f"{v}={environ[v]}" for v in stale)
        problems.append(f"{shown} are set, but no launcher started this process (torchrun sets TORCHELASTIC_RUN_ID, "
                        f"mpiexec its PMI_* variables): they look left over in your shell. `unset {' '.join(stale)}` "
                        "to start the ranks here, or start the command with torchrun")
    return problems


def check_environment(environ: Mapping[str, str] | None = None, command: str | None = None) -> None:
    """Raise one EnvironmentProblem listing every problem, before any process starts or any file is written."""
    problems = environment_problems(environ, command)
    if problems:
        raise EnvironmentProblem("; ".join(problems) if len(problems) > 1 else problems[0])
