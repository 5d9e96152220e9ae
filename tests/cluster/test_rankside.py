"""The rank side of a node job: its place from torchrun's variables, its parameters, its report."""
from __future__ import annotations

import json
import socket

import pytest

from labkit.cluster.rankside import address_is_local, job_params, place, report

TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
            "LABKIT_NODE_ADDR": "10.77.0.2"}


def test_place_reads_torchruns_variables(monkeypatch):
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    me = place()
    assert (me.rank, me.local_rank, me.group_rank, me.world_size, me.local_world_size) == (3, 1, 1, 4, 2)
    assert me.as_dict()["node_addr"] == "10.77.0.2"
    monkeypatch.delenv("LABKIT_NODE_ADDR")                  # under Slurm: the node's own host name
    assert place().node_addr == socket.gethostname()


def test_place_outside_torchrun_says_how_to_start(monkeypatch):
    monkeypatch.delenv("GROUP_RANK", raising=False)
    with pytest.raises(RuntimeError, match="run this under torchrun"):
        place()


def test_params_and_report(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_JOB", json.dumps({"repeats": 2}))
    monkeypatch.setenv("LABKIT_RESULT_DIR", str(tmp_path))
    assert job_params() == {"repeats": 2}
    assert report({"x": 1}, rank=5) == {"x": 1}
    assert json.loads((tmp_path / "rank5.json").read_text()) == {"x": 1}
    monkeypatch.delenv("LABKIT_JOB")
    assert job_params() == {}


def test_address_is_local():
    assert address_is_local("127.0.0.1")
    assert not address_is_local("192.0.2.1")          # TEST-NET-1: never a local address
