"""torchrun runs `labkit launch` on every rank: the command line, and running it as a terminal would, cleanly."""
from __future__ import annotations

import tempfile
from pathlib import Path

import psutil
import pytest

from labkit.comm.ports import reserved_port
from labkit.comm.torchrun import run_script_on_ranks, run_torchrun, torchrun_command


def _torchrun_leftovers() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("torchelastic_*"))


def test_same_entry_point_runs_under_torchrun():
    before = _torchrun_leftovers()
    with reserved_port() as port:
        out = run_torchrun(torchrun_command("labkit.comm.demos:all_reduce_sum", 2, master_port=port), timeout_s=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert _torchrun_leftovers() - before == set(), "torchrun's log folder outlived the run"
    for rank in range(2):
        assert f"[rank {rank}/2] labkit.comm.demos:all_reduce_sum" in out.stdout
    assert "'after': [12.0, 14.0, 16.0, 18.0]" in out.stdout


def test_torchrun_that_outlives_its_timeout_is_stopped_with_its_ranks():
    before = {p.pid for p in psutil.process_iter()}
    with pytest.raises(TimeoutError, match="timeout_s=0.5; it and its ranks were stopped"):
        run_torchrun(torchrun_command("labkit.comm.demos:all_reduce_sum", 2), timeout_s=0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
            and "labkit.comm.demos:all_reduce_sum" in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_torchrun_command_checks_its_input():
    with pytest.raises(ValueError, match="node_rank"):
        torchrun_command("labkit.comm.demos:all_reduce_sum", 2, nnodes=2, node_rank=2)
    assert "--nnodes=2" in torchrun_command("labkit.comm.demos:all_reduce_sum", 8, nnodes=2, master_port=29500)


SCRIPT = """
import torch
import torch.distributed as dist


def summed():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    print(summed())
    dist.destroy_process_group()
"""


def test_a_written_torchrun_script_runs_on_the_kits_ranks_and_leaves_nothing(own_tmp):
    import sys

    path_before = list(sys.path)
    assert run_script_on_ranks(SCRIPT, "summed", 2, module="sum_script", timeout_s=90) == [3.0, 3.0]
    assert sys.path == path_before and "sum_script" not in sys.modules
    with pytest.raises(ValueError):
        run_script_on_ranks(SCRIPT, "not a name", 2)
