"""What the checkpoint runs measured, as rows and figures: bytes and peak memory per rank (torch.save vs DCP), the
resumed state against the saved one, the shards DTensor handed each rank, and the blocking/async step timeline.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from labkit.checkpoint.exercises import shard_rows_reference
from labkit.checkpoint.saves import TORCH_SAVE_FILE
from labkit.checkpoint.store import bytes_per_rank, metadata_bytes, step_folder
from labkit.checkpoint.trainer import CheckpointConfig, predicted_state_bytes, state_differences


def save_rows(cfg: CheckpointConfig, root: str | Path, results: list[dict]) -> list[dict]:
    """One row per rank: bytes written, predicted, peak memory and seconds, for rank-0 torch.save and for DCP."""
    world_size = len(results)
    folder = step_folder(root, cfg.steps_before)
    dcp_bytes = bytes_per_rank(folder)
    torch_file = Path(root) / TORCH_SAVE_FILE
    rows = []
    for r in results:
        rank = r["rank"]
        rows.append({"rank": rank,
                     "torch_save_bytes": torch_file.stat().st_size if rank == 0 else 0,
                     "torch_save_predicted": predicted_state_bytes(cfg) if rank == 0 else 0.0,
                     "dcp_bytes": dcp_bytes.get(rank, 0) + (metadata_bytes(folder) if rank == 0 else 0),
                     "dcp_predicted": predicted_state_bytes(cfg, world_size),
                     "torch_save_peak_bytes": r["torch_save_peak_bytes"], "dcp_peak_bytes": r["dcp_peak_bytes"],
                     "torch_save_s": r["torch_save_s"], "dcp_save_s": r["dcp_save_s"]})
    return rows


def bytes_figure(rows: list[dict]) -> plt.Figure:
    """Bars: MB each rank wrote with rank-0 torch.save and with DCP, the prediction marked on each."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ranks = [r["rank"] for r in rows]
    width = 0.38
    ax.bar([k - width / 2 for k in ranks], [r["torch_save_bytes"] / 1e6 for r in rows], width, label="rank-0 torch.save")
    ax.bar([k + width / 2 for k in ranks], [r["dcp_bytes"] / 1e6 for r in rows], width, label="dcp.save")
    ax.scatter([k - width / 2 for k in ranks], [r["torch_save_predicted"] / 1e6 for r in rows], marker="_", s=400,
               color="black", label="predicted")
    ax.scatter([k + width / 2 for k in ranks], [r["dcp_predicted"] / 1e6 for r in rows], marker="_", s=400,
               color="black")
    ax.set_xticks(ranks, [f"rank {k}" for k in ranks])
    ax.set_ylabel("MB written")
    ax.set_title("bytes each rank writes: one gathered file vs one shard file per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def resume_summary(saved: list[dict], resumed: list[dict]) -> dict:
    """How a resume on len(resumed) ranks compares with the saved run: state differences (exact), the largest loss
    gap to the uninterrupted run, and the same gap for the fresh-Adam rival."""
    reference = saved[0]["losses_after"]
    gap = max(abs(a - b) for a, b in zip(resumed[0]["losses_after"], reference))
    rival_gap = max(abs(a - b) for a, b in zip(resumed[0]["fresh_adam_losses"], reference))
    return {"world_size": len(resumed), "loaded_from": resumed[0]["loaded_from"],
            "state_differences": state_differences(resumed[0]["loaded_state"], saved[0]["saved_state"]),
            "max_loss_gap": gap, "fresh_adam_max_loss_gap": rival_gap}


def shard_mismatches(saved: list[dict], resumed: list[dict]) -> list[str]:
    """Where a rank's loaded shard is not rows shard_rows_reference(...) of the saved full parameter, exactly."""
    full = saved[0]["saved_state"]["model"]
    bad = []
    for r in resumed:
        for name, shard in r["shards"].items():
            start, stop = shard_rows_reference(full[name].shape[0], len(resumed), r["rank"])
            expected = full[name][start:stop]
            if shard.shape != expected.shape or not bool((shard == expected).all()):
                bad.append(f"rank {r['rank']} {name}: got {tuple(shard.shape)}, expected rows {start}:{stop}")
    return bad


def remainder_on_last_rows(rows: int, world_size: int, rank: int) -> list[int]:
    """[start, stop) under the rival cut: rows // world_size on each rank, the remainder on the last one."""
    base = rows // world_size
    return [rank * base, rows if rank == world_size - 1 else (rank + 1) * base]


def rival_cut_differs(saved: list[dict], resumed: list[dict]) -> list[str]:
    """The shards where the rival cut (the remainder on the last rank) gives other rows than torch.chunk: where this
    run can tell the two apart ('1.weight on rank 2 of 3: rows 4:8, not 6:8')."""
    full, world_size = saved[0]["saved_state"]["model"], len(resumed)
    differ = []
    for name in resumed[0]["shards"]:
        for rank in range(world_size):
            chunk = shard_rows_reference(full[name].shape[0], world_size, rank)
            rival = remainder_on_last_rows(full[name].shape[0], world_size, rank)
            if chunk != rival:
                differ.append(f"{name} on rank {rank} of {world_size}: rows {rival[0]}:{rival[1]}, not "
                              f"{chunk[0]}:{chunk[1]}")
    return differ


def timeline_figure(results: list[dict]) -> plt.Figure:
    """Rank 0's last round of each mode: steps and the time training spent in the save, on one time axis."""
    colors = {"step": "tab:blue", "save (training waits)": "tab:red", "async_save returns": "tab:orange",
              "wait for the write": "tab:purple"}
    fig, ax = plt.subplots(figsize=(8, 3.0))
    seen = set()
    for y, (mode, events) in enumerate(results[0]["timelines"].items()):
        for kind, start, end in events:
            ax.barh(y, (end - start) * 1e3, left=start * 1e3, color=colors.get(kind, "gray"), edgecolor="white",
                    label=None if kind in seen else kind)
            seen.add(kind)
    ax.set_yticks(range(len(results[0]["timelines"])), list(results[0]["timelines"]))
    ax.set_xlabel("ms since the round started (rank 0)")
    ax.set_title(f"a save every {results[0]['every_k']} steps: blocking vs dcp.async_save")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4)
    fig.tight_layout()
    return fig
