"""A node fails mid-run: torchrun restarts the group, training resumes from the last checkpoint and ends on the
single-process reference's weights; the step log tells what ran twice and how long recovery took."""
from __future__ import annotations

import pytest

from labkit.cluster.failover import FailureConfig, recovery_summary, run_with_failure
from labkit.cluster.nodes import EmulatedNodes, NodesConfig

LOG = "\n".join([f"0 {s} {100 + s}" for s in range(0, 16)] + [f"1 {s} {130 + s}" for s in range(10, 40)]) + "\n"


def test_summary_of_a_step_log():
    got = recovery_summary(LOG, kill_time_s=116.5, steps=40, every_k=10)
    assert got["attempts"] == [0, 1] and got["steps per attempt"] == {0: (0, 15), 1: (10, 39)}
    assert got["resumed at step"] == 10 and got["resumed from a checkpoint"]
    assert got["steps lost"] == 0 and got["steps run twice"] == 6
    assert got["recovery (s)"] == pytest.approx(140 - 116.5)
    clean = recovery_summary("0 0 1.0\n0 1 2.0\n", 0.0, steps=3, every_k=1)
    assert clean["steps lost"] == 1 and clean["recovery (s)"] is None


def test_config_is_validated():
    with pytest.raises(ValueError, match="before the last step"):
        FailureConfig(steps=10, kill_after_step=9)
    with pytest.raises(ValueError, match="every_k"):
        FailureConfig(steps=10, every_k=11)


def test_a_killed_node_restarts_resumes_and_ends_on_the_reference(namespaces_here):
    config = FailureConfig(steps=30, every_k=10, kill_after_step=12)
    with EmulatedNodes(NodesConfig()) as nodes:
        job, kill = run_with_failure(nodes, config)
        assert nodes.pids(0) == [] and nodes.pids(1) == []
    assert kill["pids"], "no training process was found on the victim node"
    summary = recovery_summary(job.results[0]["step_log"], kill["time_s"], config.steps, config.every_k)
    assert summary["attempts"] == [0, 1] and summary["resumed from a checkpoint"]
    assert summary["steps lost"] == 0 and summary["steps run twice"] <= config.every_k
    assert summary["recovery (s)"] > 0
    assert all(r["max_diff_vs_reference"] < 1e-5 for r in job.results)
    assert {r["started_at_step"] for r in job.results} == {summary["resumed at step"]}


def test_fast_mode_loses_a_node_of_one_rank():
    from labkit.core.env import Mode

    assert FailureConfig.for_mode(Mode("fast", "test")).procs_per_node == 1
    assert FailureConfig.for_mode(Mode("full", "test")).procs_per_node == 2
