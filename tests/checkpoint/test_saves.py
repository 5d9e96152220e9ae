"""The lessons of notebook 16 on the shared runs (conftest): bytes, memory, failures, resharding, nothing left."""
import psutil

from labkit.checkpoint.report import resume_summary, save_rows
from labkit.checkpoint.store import check_complete, folder_digest, is_complete, latest_complete, step_folder
from labkit.checkpoint.trainer import predicted_state_bytes

from tests.checkpoint.conftest import CFG

BYTES_BAND = 0.05     # DCP's per-tensor headers: ~1.5 KB x 24 tensors per rank, under 1% of this model's shard


def test_dcp_writes_a_quarter_per_rank_and_torch_save_everything_from_rank_0(runs):
    rows = save_rows(CFG, runs["root"], runs["saved"])
    full, shard = predicted_state_bytes(CFG), predicted_state_bytes(CFG, 4)
    for row in rows:
        assert abs(row["dcp_bytes"] / shard - 1) <= BYTES_BAND, row      # rival: every rank writes it all (4x)
    assert abs(rows[0]["torch_save_bytes"] / full - 1) <= BYTES_BAND     # rival: rank 0 writes only its shard
    assert all(row["torch_save_bytes"] == 0 for row in rows[1:])


def test_rank_0_holds_the_gathered_state_to_torch_save_and_dcp_does_not(runs):
    saved = runs["saved"]
    full = predicted_state_bytes(CFG)
    assert saved[0]["torch_save_peak_bytes"] >= 0.5 * full     # Adam's gathered moments alone are 2/3; rival: 1/4
    assert max(r["dcp_peak_bytes"] for r in saved) < saved[0]["torch_save_peak_bytes"]


def test_a_full_disk_is_one_line_on_every_rank_and_leaves_an_incomplete_folder(runs):
    lines = {r["enospc_line"] for r in runs["saved"]}
    assert len(lines) == 1
    line = lines.pop()
    assert "\n" not in line and "rank 1" in line and "ENOSPC" in line
    assert not is_complete(step_folder(runs["root"], CFG.steps_before + CFG.steps_after))


def test_a_rank_killed_mid_save_leaves_a_folder_the_loader_refuses(runs):
    assert "SIGKILL" in runs["killed_line"]
    assert not is_complete(runs["killed_folder"]) and any(runs["killed_folder"].glob("*.distcp"))
    try:
        check_complete(runs["killed_folder"])
    except Exception as err:  # noqa: BLE001
        assert "step_000002" in str(err) and "\n" not in str(err)
    else:
        raise AssertionError("the killed save's folder was accepted")
    assert latest_complete(runs["root"]) == step_folder(runs["root"], CFG.steps_before)
    assert folder_digest(step_folder(runs["root"], CFG.steps_before)) == runs["digest_after_save"]


def test_saved_on_4_resumed_on_2_and_3_exactly_and_training_continues(runs):
    for world_size, resumed in runs["resumed"].items():
        summary = resume_summary(runs["saved"], resumed)
        assert summary["loaded_from"] == "step_000002"
        assert summary["state_differences"] == [], (world_size, summary["state_differences"][:5])
        # 1e-12: float64 losses of order 1; another world size sums the gradient shards in another order (ulps)
        assert summary["max_loss_gap"] <= 1e-12, summary
        assert summary["fresh_adam_max_loss_gap"] > 1e-6, summary       # rival: reloading weights without Adam


def test_nothing_is_left_behind(runs):
    assert psutil.Process().children(recursive=True) == []
    assert runs["new_launch_folders"] == set()
    names = {p.name for p in runs["root"].iterdir()}
    assert names == {"step_000002", "step_000005", "step_000006", "rank0_full.pt"}, names
