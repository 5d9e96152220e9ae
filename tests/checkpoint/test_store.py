import contextlib
import errno
import os
import subprocess

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from labkit.checkpoint.store import (FailingWriter, IncompleteCheckpointError, bytes_per_rank, check_complete,
                                     folder_digest, is_complete, latest_complete, save_error_line, step_folder)


def _fake(root, step, complete, shards=2):
    path = step_folder(root, step)
    path.mkdir(parents=True)
    for rank in range(shards):
        (path / f"__{rank}_0.distcp").write_bytes(b"x" * (10 + rank))
    if complete:
        (path / ".metadata").write_bytes(b"m")
    return path


def test_the_picker_trusts_only_folders_with_metadata(tmp_path):
    assert latest_complete(tmp_path) is None
    _fake(tmp_path, 2, complete=True)
    _fake(tmp_path, 10, complete=True)
    newest_broken = _fake(tmp_path, 12, complete=False)
    (tmp_path / "step_notanumber").mkdir()
    assert latest_complete(tmp_path) == step_folder(tmp_path, 10)     # rival: the newest folder, step 12
    assert not is_complete(newest_broken)
    assert bytes_per_rank(newest_broken) == {0: 10, 1: 11}


def test_an_incomplete_folder_is_refused_in_one_line_naming_the_fallback(tmp_path):
    _fake(tmp_path, 2, complete=True)
    broken = _fake(tmp_path, 4, complete=False)
    with pytest.raises(IncompleteCheckpointError) as err:
        check_complete(broken)
    line = str(err.value)
    assert "\n" not in line and "no .metadata" in line and "step_000002" in line
    assert check_complete(step_folder(tmp_path, 2)) == step_folder(tmp_path, 2)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_full_disk_is_one_line_and_the_previous_checkpoint_is_untouched(tmp_path):
    state = {"w": torch.arange(1000.0)}
    good = step_folder(tmp_path, 1)
    dcp.save(state, checkpoint_id=str(good), no_dist=True)               # one process: DCP runs without a process group
    assert is_complete(good)
    digest = folder_digest(good)
    bad = step_folder(tmp_path, 2)
    with pytest.raises(CheckpointException) as err:
        dcp.save(state, storage_writer=FailingWriter(bad, 0, "enospc"), no_dist=True)
    line = save_error_line(err.value, bad)
    assert "\n" not in line and "No space left on device (ENOSPC)" in line and "incomplete" in line, line
    assert latest_complete(tmp_path) == good and folder_digest(good) == digest
    loaded = {"w": torch.zeros(1000)}
    dcp.load(loaded, checkpoint_id=str(check_complete(latest_complete(tmp_path))), no_dist=True)
    assert torch.equal(loaded["w"], state["w"])


def test_a_plain_os_error_reads_the_same_and_the_writer_refuses_unknown_failures(tmp_path):
    line = save_error_line(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert "ENOSPC" in line
    other = save_error_line(RuntimeError("boom\nmore"), tmp_path)      # room on the disk: torch's words, one line
    assert "RuntimeError: boom" in other and "ENOSPC" not in other and "\n" not in other
    with pytest.raises(ValueError):
        FailingWriter(tmp_path, 0, "flood")


@contextlib.contextmanager
def tiny_disk(path, size="1m"):
    """A real 1 MiB disk (tmpfs, root only), unmounted whatever happens."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (the ENOSPC writer above covers the same line)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_real_full_disk_is_the_same_one_line_and_the_previous_checkpoint_loads(tmp_path):
    with tiny_disk(tmp_path / "disk") as disk:
        small = {"w": torch.arange(1000.0)}
        dcp.save(small, checkpoint_id=str(step_folder(disk, 1)), no_dist=True)
        digest = folder_digest(step_folder(disk, 1))
        with pytest.raises(CheckpointException) as err:
            dcp.save({"w": torch.zeros(300_000, dtype=torch.float64)}, checkpoint_id=str(step_folder(disk, 2)),
                     no_dist=True)                                    # 2.4 MB on a 1 MiB disk
        line = save_error_line(err.value, step_folder(disk, 2))
        assert "\n" not in line and "No space left on device (ENOSPC)" in line and "incomplete" in line, line
        assert latest_complete(disk) == step_folder(disk, 1) and folder_digest(step_folder(disk, 1)) == digest
        loaded = {"w": torch.zeros(1000)}
        dcp.load(loaded, checkpoint_id=str(check_complete(latest_complete(disk))), no_dist=True)
        assert torch.equal(loaded["w"], small["w"])
    assert not os.path.ismount(tmp_path / "disk")
