"""The torchrun command one node runs: c10d rendezvous at node 0, the store hosted where the address says so."""
from __future__ import annotations

import pytest

from labkit.comm.launch_nodes import NodeLaunch, parse_endpoint, torchrun_nodes_command


def test_every_node_runs_the_same_command_but_its_rank_and_address():
    cmds = [torchrun_nodes_command("labkit.comm.demos:all_reduce_sum",
                                   NodeLaunch(2, k, 2, "10.77.0.1:29400", local_addr=f"10.77.0.{k + 1}"))
            for k in range(2)]
    assert cmds[0][0].endswith("torchrun")
    for flag in ("--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.77.0.1:29400",
                 "--rdzv-id=labkit", "--max-restarts=0"):
        assert flag in cmds[0] and flag in cmds[1]
    assert "--node-rank=1" in cmds[1] and "--local-addr=10.77.0.2" in cmds[1]
    assert "--rdzv-conf=is_host=1" in cmds[0] and "--rdzv-conf=is_host=1" not in cmds[1]
    assert cmds[0][-4:] == ["-m", "labkit", "launch", "labkit.comm.demos:all_reduce_sum"]
    assert NodeLaunch(3, 0, 4, "h:1").world_size == 12


@pytest.mark.parametrize("kwargs, match", [
    ({"nnodes": 2, "node_rank": 2, "nproc_per_node": 1, "rdzv_endpoint": "h:1"}, "nodes are numbered 0..1"),
    ({"nnodes": 2, "node_rank": 0, "nproc_per_node": 0, "rdzv_endpoint": "h:1"}, "nproc_per_node"),
    ({"nnodes": 2, "node_rank": 0, "nproc_per_node": 1, "rdzv_endpoint": "h"}, "HOST:PORT"),
    ({"nnodes": 2, "node_rank": 0, "nproc_per_node": 1, "rdzv_endpoint": "h:1", "rdzv_id": "a b"}, "rdzv_id"),
])
def test_bad_values_get_one_clear_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NodeLaunch(**kwargs)


def test_endpoint_parsing():
    assert parse_endpoint("10.77.0.1:29400") == ("10.77.0.1", 29400)
    for bad in ("10.77.0.1", ":1", "h:0", "h:70000", None):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_endpoint(bad)
    with pytest.raises(ValueError, match="package.module:function"):
        torchrun_nodes_command("nope", NodeLaunch(1, 0, 1, "h:1"))
