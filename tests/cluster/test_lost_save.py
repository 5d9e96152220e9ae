"""A node lost inside a DCP save on the emulated cluster: the half-written folder is refused, the surviving node
resumes alone (2 ranks, was 4) from the last complete checkpoint, exactly; nothing is left behind."""
from __future__ import annotations

import matplotlib.pyplot as plt
import psutil
import pytest

from labkit.checkpoint.store import is_complete, latest_complete, step_folder
from labkit.checkpoint.trainer import CheckpointConfig
from labkit.cluster.lost_save import (CHECKPOINTS, LostSaveConfig, resume_summary, run_lost_save,
                                      run_resume_on_survivor, timeline_figure)
from labkit.cluster.nodes import EmulatedNodes, NodesConfig, namespaces_alive

CFG = CheckpointConfig.smoke()
LOST = LostSaveConfig()


def test_config_is_validated_and_names_its_steps():
    assert (LOST.resume_step, LOST.lost_step) == (2, 4)
    assert LostSaveConfig(every_k=3, complete_saves=2).lost_step == 9
    with pytest.raises(ValueError, match="rendezvous"):
        LostSaveConfig(victim=0)
    with pytest.raises(ValueError, match="complete_saves"):
        LostSaveConfig(complete_saves=0)


@pytest.fixture(scope="module")
def lost_run(namespaces_here, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lost_save")
    with EmulatedNodes(NodesConfig()) as nodes:
        ids, scratch = nodes.namespace_ids(), nodes.scratch
        kill = run_lost_save(nodes, CFG, LOST, folder)
        resumed = run_resume_on_survivor(nodes, CFG, LOST, folder)
        left = nodes.pids(0) + nodes.pids(1)
    return {"folder": folder, "kill": kill, "resumed": resumed, "left_in_nodes": left, "alive": namespaces_alive(ids),
            "scratch_left": scratch.exists(), "children": psutil.Process().children(recursive=True)}


def test_the_kill_lands_inside_the_save_and_leaves_it_incomplete(lost_run):
    kill = lost_run["kill"]
    assert kill["pids"], "no training process was found on the victim node"
    assert sorted(kill["marks"]) == ["rank2", "rank3"]                   # both victim ranks were inside the save
    assert all(at <= kill["time_s"] for at in kill["marks"].values())
    assert kill["complete_at_kill"] == {"step_000002": True, "step_000004": False}
    assert kill["complete_after"] == kill["complete_at_kill"]            # nothing finished it after the kill
    assert "failed first" in kill["failure"]
    root = lost_run["folder"] / CHECKPOINTS
    assert any(step_folder(root, 4).glob("*.distcp")) and not is_complete(step_folder(root, 4))
    assert latest_complete(root) == step_folder(root, 2)                 # rival: the newest folder is loaded


def test_the_survivor_resumes_alone_exactly_from_the_last_complete_checkpoint(lost_run):
    summary = resume_summary(lost_run["folder"], lost_run["resumed"], LOST)
    assert summary["world_size"] == 2 and summary["newest"] == "step_000004"
    assert "step_000002" in summary["refusal"] and "\n" not in summary["refusal"]
    assert summary["loaded_from"] == "step_000002"
    assert summary["state_differences"] == []
    assert summary["max_loss_gap"] <= 1e-12, summary       # float64, another world size sums in another order
    assert summary["fresh_adam_max_loss_gap"] > 1e-6, summary               # rival: weights back, Adam lost


def test_the_timeline_draws_the_kill(lost_run):
    fig = timeline_figure(lost_run["folder"], lost_run["kill"])
    assert "INCOMPLETE" in fig.axes[0].get_title()
    plt.close(fig)


def test_nothing_is_left_behind(lost_run):
    assert lost_run["left_in_nodes"] == [] and lost_run["alive"] == [] and lost_run["children"] == []
    assert not lost_run["scratch_left"]
    names = {p.name for p in lost_run["folder"].iterdir()}
    assert names <= {"checkpoints", "mid-save", "save_job", "resume_job", "losses.log", "events.log",
                     "saved_step_000002.pt"}, names
    assert {p.name for p in (lost_run["folder"] / CHECKPOINTS).iterdir()} == {"step_000002", "step_000004"}
