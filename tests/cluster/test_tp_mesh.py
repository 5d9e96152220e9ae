"""The 2 x 2 mesh placed two ways: the groups, the predicted bytes over the slow link, and (where namespaces can be
made) both placements on two emulated nodes, counted on eth0, with nothing left behind."""
from __future__ import annotations

import psutil
import pytest

from labkit.comm.stop import wait_vanished
from labkit.cluster import tp_mesh
from labkit.core.verdict import Load
from labkit.parallel.tensor.megatron import LayerShape

SHAPE = LayerShape(seq_len=32, batch=2)


def test_tp_inside_puts_each_node_s_ranks_in_one_tp_group_and_dp_inside_the_opposite():
    assert tp_mesh.mesh_members("tp_inside", 2, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert tp_mesh.mesh_members("dp_inside", 2, 2) == ([[0, 2], [1, 3]], [[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="placement must be"):
        tp_mesh.mesh_members("diagonal", 2, 2)


def test_predicted_bytes_per_node_worked_by_hand():
    # tp_inside: 2 ranks x the DP ring of two over each rank's TP half: ((12h^2 + 13h - 6h) / 2 + 6h) fp32 values
    h = SHAPE.d_model
    local = (12 * h * h + 13 * h - 6 * h) // 2 + 6 * h
    assert tp_mesh.predicted_node_bytes("tp_inside", SHAPE) == 2 * 4 * local
    # dp_inside: 2 ranks x 4 all-reduces (ring of two: all of it) of the half batch's b*s*h fp32 activations
    assert tp_mesh.predicted_node_bytes("dp_inside", SHAPE) == 2 * 4 * (1 * 32 * h * 4)


NOTEBOOK_SHAPE = LayerShape()      # 128 KiB messages: headers and ACKs add ~3% (at 16 KiB, ~25%)


@pytest.fixture(scope="module")
def placed(namespaces_here):
    return tp_mesh.measure_placements(NOTEBOOK_SHAPE, rounds=3)


def test_both_placements_run_and_eth0_counts_the_predicted_bytes(placed):
    rows = {r["placement"]: r for r in tp_mesh.placement_rows(placed, NOTEBOOK_SHAPE, 200.0)}
    for row in rows.values():
        assert row["predicted_bytes"] <= row["eth0_bytes"] <= 1.1 * row["predicted_bytes"], row   # + TCP/IP headers, barriers
    assert rows["tp_inside"]["eth0_bytes"] < rows["dp_inside"]["eth0_bytes"]
    assert isinstance(tp_mesh.placement_load(placed), Load)


def test_the_nodes_are_gone_after_the_run(placed):
    # an exited child not reaped yet (a zombie) is gone: a CI run failed on one (issue 53's pattern)
    assert wait_vanished(psutil.Process().children(recursive=True), 5) == []


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan")])
def test_measure_placements_takes_a_timeout_checked_before_any_node_is_built(monkeypatch, timeout_s):
    """issue 53: it had no timeout parameter (a frozen rank kept it for the fixed 120 s)."""
    built = []
    monkeypatch.setattr(tp_mesh, "EmulatedNodes", lambda *a, **k: built.append(1))
    with pytest.raises(ValueError, match="timeout_s"):
        tp_mesh.measure_placements(LayerShape(batch=4, seq_len=8, d_model=16, heads=2), rounds=1, timeout_s=timeout_s)
    assert built == []


def test_measure_placements_passes_its_timeout_to_the_job(monkeypatch):
    seen = {}

    class FakeNodes:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def fake_run(nodes, shape, rounds, timeout_s):
        seen["timeout_s"] = timeout_s
        return type("Result", (), {"results": ["ok"]})()

    monkeypatch.setattr(tp_mesh, "EmulatedNodes", lambda *a, **k: FakeNodes())
    monkeypatch.setattr(tp_mesh, "run_placements", fake_run)
    assert tp_mesh.measure_placements(LayerShape(batch=4, seq_len=8, d_model=16, heads=2), timeout_s=7.5) == ["ok"]
    assert seen == {"timeout_s": 7.5}
