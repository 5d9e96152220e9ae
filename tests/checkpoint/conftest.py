"""One set of real-rank runs shared by the checkpoint tests: save on 4 ranks (with a save that hits ENOSPC), a save
killed mid-write on 2, resumes on 2 and 3, and the async rounds; each launch takes seconds, so they run once."""
import os
import tempfile
from pathlib import Path

import pytest

from labkit.checkpoint import async_saves, saves
from labkit.checkpoint.store import folder_digest, step_folder
from labkit.checkpoint.trainer import CheckpointConfig

CFG = CheckpointConfig.fast()       # 15.5 MB of state on a CPU: rank 0's gathered copy stands out from DCP's fixed cost


def _launch_folders() -> set[str]:
    """This process's launch folders (others' launches may share the temporary folder)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"labkit-launch-{os.getpid()}-*")}


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Every run, in the order the notebook makes them, and what the folder held between them."""
    root = tmp_path_factory.mktemp("checkpoints")
    before = _launch_folders()
    saved = saves.run_save(CFG, root, world_size=4)
    digest = folder_digest(step_folder(root, CFG.steps_before))
    killed_folder, killed_line = saves.run_killed_save(CFG, root, world_size=2)
    resumed = {w: saves.run_resume(CFG, root, w) for w in (2, 3)}
    timed = async_saves.run_async(CFG, root, world_size=2, rounds=2)
    return {"root": root, "saved": saved, "digest_after_save": digest, "killed_folder": killed_folder,
            "killed_line": killed_line, "resumed": resumed, "async": timed,
            "new_launch_folders": _launch_folders() - before, "pid": os.getpid()}
