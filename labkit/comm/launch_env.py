"""Who am I in the job? Rank, world size and local rank from whichever launcher started this process.

Launchers announce a process's place through environment variables, each family with its own names:

* torchrun (and `labkit.comm.launch.launch`): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (``LOCAL_WORLD_SIZE``);
* MPICH's and Intel MPI's Hydra ``mpiexec``: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` (``MPI_LOCALNRANKS``);
* Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``
  (documented in Open MPI's "Environment variables set for MPI applications");
* MVAPICH2: ``MV2_COMM_WORLD_RANK``, ``MV2_COMM_WORLD_SIZE``, ``MV2_COMM_WORLD_LOCAL_RANK``;
* PMIx launchers (prterun, ``srun --mpi=pmix``): ``PMIX_RANK`` (no size variable: pair it with one above).

No process is started and nothing is imported here (no torch, no mpi4py), so this runs in a blink on every rank.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

LAUNCHERS = ("single", "torchrun", "env", "hydra", "openmpi", "mvapich", "pmix")

# launcher -> (rank variable, world-size variable, local-rank variable, local-world-size variable)
MPI_VARIABLES: dict[str, tuple[str, str | None, str | None, str | None]] = {
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "mvapich": ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    "hydra": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "pmix": ("PMIX_RANK", None, None, None),
}
TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class LaunchEnvError(ValueError):
    """The launcher's environment variables are missing, malformed or contradict each other."""


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in the job, and which launcher said so."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str
    local_world_size: int | None = None

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise LaunchEnvError(f"launcher must be one of {LAUNCHERS}, got {self.launcher!r}")
        if self.world_size < 1:
            raise LaunchEnvError(f"world_size must be >= 1, got {self.world_size} (launcher {self.launcher})")
        if not 0 <= self.rank < self.world_size:
            raise LaunchEnvError(f"rank must be in [0, {self.world_size}), got {self.rank} (launcher {self.launcher})")
        if not 0 <= self.local_rank < self.world_size:
            raise LaunchEnvError(f"local_rank must be in [0, {self.world_size}), got {self.local_rank} "
                                 f"(launcher {self.launcher})")
        lws = self.local_world_size
        if lws is not None and not (1 <= lws <= self.world_size and self.local_rank < lws):
            raise LaunchEnvError(f"local_world_size={lws} is inconsistent with local_rank={self.local_rank} and "
                                 f"world_size={self.world_size} (launcher {self.launcher})")

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    def torch_env(self) -> dict[str, str]:
        """The torchrun-style variables (``RANK``, ``WORLD_SIZE``, ...) for ``init_process_group('env://')``."""
        out = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank)}
        if self.local_world_size is not None:
            out["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return out


def _read_int(environ: Mapping[str, str], name: str | None) -> int | None:
    """The integer value of ``environ[name]``, None when unset; a clear error when it is not an integer."""
    if name is None or name not in environ:
        return None
    text = environ[name].strip()
    try:
        return int(text)
    except ValueError:
        raise LaunchEnvError(f"environment variable {name}={environ[name]!r} must be an integer") from None


def _torch_env(environ: Mapping[str, str]) -> LaunchEnv | None:
    """The torchrun-style view, or None when neither RANK nor WORLD_SIZE is set."""
    rank, size, local, local_size = (_read_int(environ, n) for n in TORCH_VARIABLES)
    if rank is None and size is None:
        return None
    if rank is None or size is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        raise LaunchEnvError(f"{missing} is unset while {'WORLD_SIZE' if rank is None else 'RANK'} is set; "
                             "set both (torchrun does) or neither")
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in environ else "env"
    return LaunchEnv(rank, size, local if local is not None else 0, launcher, local_size)


def _mpi_views(environ: Mapping[str, str]) -> list[LaunchEnv]:
    """One view per MPI launcher family whose rank variable is set (usually zero or one)."""
    views = []
    for launcher, (rank_var, size_var, local_var, local_size_var) in MPI_VARIABLES.items():
        rank = _read_int(environ, rank_var)
        if rank is None:
            continue
        size = _read_int(environ, size_var)
        if size is None:
            size = views[0].world_size if views else _read_int(environ, "WORLD_SIZE")
        if size is None:
            raise LaunchEnvError(f"{rank_var} is set but no world size is: {size_var or 'PMIx'} gives none here; "
                                 "export WORLD_SIZE (e.g. mpiexec -x WORLD_SIZE=N) or use a launcher that sets it")
        local = _read_int(environ, local_var)
        if local is None:
            local = _read_int(environ, "LOCAL_RANK") or 0
        views.append(LaunchEnv(rank, size, local, launcher, _read_int(environ, local_size_var)))
    return views


def _check_agree(mpi: LaunchEnv, environ: Mapping[str, str], others: list[LaunchEnv]) -> None:
    """Raise when two launchers' variables name different places for this process."""
    rank_var, size_var, _, _ = MPI_VARIABLES[mpi.launcher]
    for field, mpi_name, torch_name in (("rank", rank_var, "RANK"), ("world_size", size_var, "WORLD_SIZE")):
        ours = getattr(mpi, field)
        claims = [(torch_name, _read_int(environ, torch_name))]
        claims += [(MPI_VARIABLES[o.launcher][0 if field == "rank" else 1] or o.launcher, getattr(o, field))
                   for o in others]
        for name, value in claims:
            if value is not None and value != ours:
                raise LaunchEnvError(f"inconsistent launch environment: {mpi_name or mpi.launcher}={ours} but "
                                     f"{name}={value}; unset the stale {name} or launch with one launcher")


def detect_launcher_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Rank, world size and local rank from torchrun's or an MPI launcher's variables; one process if none."""
    environ = os.environ if environ is None else environ
    mpi_views = _mpi_views(environ)
    if mpi_views:
        _check_agree(mpi_views[0], environ, mpi_views[1:])
        return mpi_views[0]
    torch_view = _torch_env(environ)
    if torch_view is not None:
        return torch_view
    return LaunchEnv(rank=0, world_size=1, local_rank=0, launcher="single", local_world_size=1)
