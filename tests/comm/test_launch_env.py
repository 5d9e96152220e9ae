"""Launcher-environment detection: each launcher's variables, the single-process default, clear errors."""
import pytest

from labkit.comm.launch_env import LaunchEnv, LaunchEnvError, detect_launcher_env


@pytest.mark.parametrize("environ, expected", [
    ({}, LaunchEnv(0, 1, 0, "single", 1)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc"},
     LaunchEnv(1, 2, 1, "torchrun", 2)),
    ({"RANK": "3", "WORLD_SIZE": "4"}, LaunchEnv(3, 4, 0, "env")),
    ({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3", "PMI_FD": "9"},
     LaunchEnv(2, 3, 2, "hydra", 3)),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PMIX_RANK": "5"}, LaunchEnv(5, 8, 1, "openmpi", 4)),
    ({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_LOCAL_RANK": "0"},
     LaunchEnv(1, 2, 0, "mvapich")),
    ({"PMIX_RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, LaunchEnv(2, 4, 0, "pmix")),
    # an MPI launch whose script also exported the torchrun names (consistently): the MPI launcher is reported
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "RANK": "1", "WORLD_SIZE": "2"},
     LaunchEnv(1, 2, 1, "hydra")),
])
def test_each_launcher_is_detected(environ, expected):
    assert detect_launcher_env(environ) == expected


def test_reads_os_environ_by_default(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK",
                 "MV2_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    env = detect_launcher_env()
    assert (env.rank, env.world_size, env.launcher, env.distributed) == (0, 2, "hydra", True)


def test_torch_env_round_trips():
    env = detect_launcher_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3",
                               "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    assert env.torch_env() == {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1"}
    again = detect_launcher_env({**env.torch_env()})
    assert (again.rank, again.world_size, again.local_rank) == (1, 3, 1)


@pytest.mark.parametrize("environ, words", [
    ({"PMI_RANK": "1", "PMI_SIZE": "3", "RANK": "0", "WORLD_SIZE": "3"}, ["PMI_RANK=1", "RANK=0", "inconsistent"]),
    ({"PMI_RANK": "1", "PMI_SIZE": "3", "WORLD_SIZE": "2"}, ["PMI_SIZE=3", "WORLD_SIZE=2"]),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "1"}, ["PMIX_RANK=1"]),
    ({"RANK": "1"}, ["WORLD_SIZE is unset"]),
    ({"WORLD_SIZE": "2"}, ["RANK is unset"]),
    ({"RANK": "two", "WORLD_SIZE": "2"}, ["RANK='two'", "integer"]),
    ({"RANK": "2", "WORLD_SIZE": "2"}, ["rank must be in [0, 2)"]),
    ({"RANK": "0", "WORLD_SIZE": "0"}, ["world_size must be >= 1"]),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "5"}, ["local_rank"]),
    ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, ["local_world_size=2"]),
    ({"PMIX_RANK": "1"}, ["PMIX_RANK is set but no world size", "WORLD_SIZE"]),
])
def test_bad_environments_raise_one_clear_error(environ, words):
    with pytest.raises(LaunchEnvError) as info:
        detect_launcher_env(environ)
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)


def test_unknown_launcher_name_is_rejected():
    with pytest.raises(LaunchEnvError, match="launcher must be one of"):
        LaunchEnv(0, 1, 0, "slurmish")
