"""The node lab's tables and verdicts, on hand-made results (the live run is tests/cluster/test_link_jobs.py)."""
from __future__ import annotations

import pandas as pd
import pytest

from labkit.cluster.lab import (LabConfig, at_rate, edge_shrinks, places_are_node_by_node, simulated_link_bytes,
                                too_noisy, two_level_edge, verdict)
from labkit.core.env import Mode


def _rank(rank: int, group: int, local: int, addr: str) -> dict:
    return {"rank": rank, "group_rank": group, "local_rank": local, "world_size": 4, "node_addr": addr,
            "owns_node_addr": True, "by_rate": {"200": {"allreduce": {}}}}


GOOD = [_rank(0, 0, 0, "a"), _rank(1, 0, 1, "a"), _rank(2, 1, 0, "b"), _rank(3, 1, 1, "b")]


def test_places_node_by_node():
    assert places_are_node_by_node(GOOD, 2, 2)
    swapped = [_rank(0, 0, 0, "a"), _rank(1, 1, 1, "b"), _rank(2, 1, 0, "b"), _rank(3, 0, 1, "a")]
    assert not places_are_node_by_node(swapped, 2, 2)
    same_addr = [dict(r, node_addr="a") for r in GOOD]
    assert not places_are_node_by_node(same_addr, 2, 2)
    assert at_rate(GOOD, 200)[0]["allreduce"] == {}


def test_verdict_decides_only_on_a_clear_margin():
    assert verdict({"flat": 2.0, "hierarchical": 1.0}, 0.6) == {
        "model winner": "hierarchical", "model margin": 2.0, "clock winner": "hierarchical", "decided": True,
        "agrees": True}
    assert verdict({"flat": 2.0, "hierarchical": 1.0}, 1.2)["agrees"] is False
    close = verdict({"flat": 1.1, "hierarchical": 1.0}, 1.2)
    assert not close["decided"] and close["agrees"] is None
    assert not verdict({"flat": 2.0, "hierarchical": 1.0}, 0.6, spread=2.0)["decided"]     # rounds disagree


def test_simulated_bytes_across_for_two_nodes_of_two():
    assert simulated_link_bytes(4096, 2, 2) == {"flat": 6144, "hierarchical": 4096}


def test_edge_and_whether_it_shrinks():
    table = pd.DataFrame([{"link (Mbit/s)": r, "size (KiB)": s, "two-level / flat (paired)": p,
                           "model flat (ms)": mf, "model two-level (ms)": mh, "round spread": 1.1}
                          for r, s, p, mf, mh in ((200, 1, 0.9, 1, 1), (200, 8, 0.5, 3, 2), (2000, 8, 1.0, 1, 1))])
    edge = {200: two_level_edge(table, 200), 2000: two_level_edge(table, 2000)}
    assert edge[200] == {"measured": 2.0, "model": 1.5, "round spread": 1.1}
    assert edge[2000] == {"measured": 1.0, "model": 1.0, "round spread": 1.1}
    assert edge_shrinks(edge, (200, 2000)) and not edge_shrinks({200: edge[2000], 2000: edge[200]}, (200, 2000))
    assert too_noisy(edge) is None
    assert "INCONCLUSIVE" in too_noisy({200: dict(edge[200], **{"round spread": 2.0})})


def test_config_by_mode_and_validation():
    assert LabConfig.for_mode(Mode("fast", "test")).procs_per_node == 2
    assert LabConfig.for_mode(Mode("full", "test")).procs_per_node == 4
    with pytest.raises(ValueError, match="nodes must be >= 2"):
        LabConfig(nodes=1)
    with pytest.raises(ValueError, match="rates_mbit_s"):
        LabConfig(rates_mbit_s=())


@pytest.mark.parametrize("stop, code, words", [("sigint", 130, "interrupted (Ctrl-C)"), ("timeout", 1, "timed out")])
def test_a_stopped_lab_keeps_every_speed_all_ranks_finished(tmp_path, monkeypatch, stop, code, words):
    """The ranks report after each speed; a real Ctrl-C (or the job's timeout) after the first keeps it on disk."""
    import json
    import os
    import signal
    import types

    import labkit.cluster.lab as lab
    from labkit.cluster.nodes import NodesConfig
    from labkit.core.results import StoppedEarly

    def first_speed_then_stop(nodes, target, nproc_per_node, params, *, timeout_s, result_dir):
        for rank in range(4):      # two nodes of two ranks; the second speed never finishes
            (result_dir / f"rank{rank}.json").write_text(json.dumps({**_rank(rank, rank // 2, rank % 2, "a"),
                                                                     "by_rate": {"200": {"allreduce": {"n": rank}}}}))
        if stop == "timeout":
            raise TimeoutError("link_lab: node 0 did not finish within 1 s")
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000_000):
            pass
        pytest.fail("SIGINT did not stop the lab")

    monkeypatch.setattr(lab, "run_job", first_speed_then_stop)
    results = tmp_path / "links.jsonl"
    with pytest.raises(StoppedEarly) as stopped:
        lab.run_link_lab(types.SimpleNamespace(config=NodesConfig.fast()),
                         LabConfig(rates_mbit_s=(200.0, 800.0)), results=results)
    assert stopped.value.code == code
    assert str(stopped.value).startswith(f"{words} after 1 of 2 link speeds; results so far in {results}")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["rate_mbit_s"] for r in rows] == [200.0] and [r["allreduce"]["n"] for r in rows[0]["ranks"]] == [0, 1, 2, 3]


def _pinged(rank: int, times_2000: list[float], shares: dict[str, float]) -> dict:
    """A rank's results at 200 Mbit/s whose inter-node ping-pongs give 1/beta = 1000 B/s x (1 s / the 2000 B time - 1)."""
    pings = {"intra": {"8": [1e-5] * 3, "1000": [1e-3] * 3, "2000": [2e-3] * 3},
             "inter": {"8": [1e-4] * 3, "1000": [1.0] * 3, "2000": times_2000}}
    return {"rank": rank, "by_rate": {"200": {"ping_pong_s": pings, "ping_pong_cpu_share": shares}}}


def test_the_fitted_link_rate_is_judged_with_the_pairs_shares_and_the_repeats_spread(monkeypatch):
    import labkit.cluster.lab as lab

    monkeypatch.setattr(lab, "expected_payload_bytes_s", lambda rate: 1000.0)      # the shaped rate: 1000 B/s
    right = [_pinged(0, [2.0] * 3, {"intra": 1.0, "inter": 1.0}), _pinged(2, [2.0] * 3, {"inter": 1.0})]
    assert lab.link_rate_verdict("1/beta is the shaped rate", right, 200).state == "checked"
    slow = [_pinged(0, [4.0] * 3, {"inter": 1.0}), _pinged(2, [4.0] * 3, {"inter": 1.0})]   # a third of it, quiet
    assert lab.link_rate_verdict("1/beta is the shaped rate", slow, 200).state == "failed"
    starved = [_pinged(0, [4.0] * 3, {"inter": 0.3}), _pinged(2, [4.0] * 3, {"inter": 0.25})]
    verdict = lab.link_rate_verdict("1/beta is the shaped rate", starved, 200)
    assert verdict.state == "INCONCLUSIVE" and "rank 2 got 0.25 of a core" in verdict.detail
    straddled = [_pinged(0, [2.0, 4.0, 4.0], {"inter": 1.0}), _pinged(2, [2.0, 4.0, 4.0], {"inter": 1.0})]
    verdict = lab.link_rate_verdict("1/beta is the shaped rate", straddled, 200)   # one repeat at the shaped rate
    assert verdict.state == "INCONCLUSIVE" and "3 paired rounds do not settle it" in verdict.detail
    assert lab.link_rate_verdict("1/beta is the shaped rate", right, 200).rival.startswith("Mbit/s read as MB/s")
    bits_for_bytes = [_pinged(0, [1.125] * 3, {"inter": 1.0}), _pinged(2, [1.125] * 3, {"inter": 1.0})]   # 8x
    verdict = lab.link_rate_verdict("1/beta is the shaped rate", bits_for_bytes, 200)   # the rival is true
    assert verdict.state == "failed" and "cannot tell" in verdict.detail
