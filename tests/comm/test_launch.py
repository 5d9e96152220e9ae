"""The launcher: results, output order, errors, timeouts and no orphaned processes (real gloo processes)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

import labkit.comm.launch as ld
from labkit.comm.launch import LaunchTimeout, RankFailedError, launch, target_name
from tests.launch_support import parent_of_sleeping_ranks

REPO = Path(__file__).resolve().parents[2]
WORKER_MARK = "labkit.comm.worker"


# ---- functions the worker processes import by name (this module is importable from the children)
def report_and_print(lines: int = 3) -> tuple:
    rank = dist.get_rank()
    for i in range(lines):
        print(f"line {i} from rank {rank}", flush=True)
        time.sleep(0.05)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return rank, dist.get_world_size(), dist.get_backend(), torch.get_num_threads(), t.item()


def fail_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank one is unhappy")
    dist.barrier()


def sleep_forever() -> None:
    time.sleep(600)


def rank_one_never_joins() -> None:
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))


def _worker_children() -> list[psutil.Process]:
    """Descendants of this test process that are launcher workers."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(WORKER_MARK in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def _assert_no_orphans() -> None:
    assert _worker_children() == []


# ---- happy path
@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_returns_values_in_rank_order_and_prints_output_rank_by_rank(capsys, start_method):
    results = launch(report_and_print, 2, timeout_s=90, start_method=start_method)
    assert [r[0] for r in results] == [0, 1]
    assert all(r[1] == 2 and r[2] == "gloo" for r in results)
    assert all(r[3] == 1 for r in results)  # one torch thread per rank by default (no oversubscription)
    assert all(r[4] == 3.0 for r in results)  # 1 + 2 summed by a real all_reduce
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "line" in ln]
    assert lines == [f"[rank {r}] line {i} from rank {r}" for r in range(2) for i in range(3)]
    _assert_no_orphans()


def test_string_target_and_world_of_one():
    assert launch("labkit.comm.demos:all_reduce_sum", 1, timeout_s=90, show_output=False)[0]["after"] == \
        [1.0, 2.0, 3.0, 4.0]


# ---- failures
@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_failing_rank_traceback_is_reraised_and_children_cleaned_up(start_method):
    with pytest.raises(RankFailedError) as info:
        launch(fail_on_rank_one, 2, timeout_s=90, pg_timeout_s=30, show_output=False, start_method=start_method)
    err = info.value
    assert err.rank == 1
    assert "ValueError: rank one is unhappy" in str(err)
    assert "fail_on_rank_one" in err.remote_traceback
    _assert_no_orphans()


@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_timeout_kills_every_rank_and_names_them(start_method):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match=r"rank\(s\) \[0, 1\] were still running"):
        launch(sleep_forever, 2, timeout_s=3, show_output=False, start_method=start_method)
    assert time.monotonic() - start < 30
    _assert_no_orphans()


def test_pg_timeout_turns_a_stuck_collective_into_an_error():
    with pytest.raises(RankFailedError) as info:
        launch(rank_one_never_joins, 2, timeout_s=90, pg_timeout_s=3, show_output=False)
    assert info.value.rank == 0  # rank 0 waited in all_reduce for a partner that never came
    _assert_no_orphans()


@pytest.mark.parametrize("start_method", ["forkserver", "fresh"])
def test_keyboard_interrupt_stops_all_children(monkeypatch, start_method):
    def interrupted_wait(procs, timeout_s, run_dir, on_result=None):
        assert all(p.poll() is None for p in procs)
        raise KeyboardInterrupt

    monkeypatch.setattr(ld, "_wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        launch(sleep_forever, 2, timeout_s=60, show_output=False, start_method=start_method)
    _assert_no_orphans()


# ---- bad input: one clear error, no process started
def _nested():
    def inner():
        return 1
    return inner


@pytest.mark.parametrize("fn", [lambda: 1, _nested()], ids=["lambda", "nested"])
def test_functions_without_an_importable_name_are_refused(fn):
    with pytest.raises(ValueError, match="Move it into a module"):
        launch(fn, 2)


def test_notebook_function_is_refused():
    fn = _nested()
    fn.__module__, fn.__qualname__ = "__main__", "train"
    with pytest.raises(ValueError, match="notebook cell"):
        target_name(fn)


@pytest.mark.parametrize("world_size", [0, -1, 2.0, "2", True])
def test_bad_world_size(world_size):
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        launch(report_and_print, world_size)


def test_world_size_beyond_the_machine():
    with pytest.raises(ValueError, match="processes per CPU core"):
        launch(report_and_print, 1000)


def test_nccl_without_enough_gpus():
    if torch.cuda.device_count() >= 64:
        pytest.skip("this machine has 64 GPUs")
    with pytest.raises(ValueError, match="one CUDA GPU per rank"):
        launch(report_and_print, 64, backend="nccl")


@pytest.mark.parametrize("kwargs,match", [({"backend": "mpi"}, "backend must be one of"),
                                          ({"timeout_s": 0}, "timeout_s must be a number > 0"),
                                          ({"pg_timeout_s": -1}, "pg_timeout_s must be a number > 0"),
                                          ({"threads_per_rank": 0}, "threads_per_rank"),
                                          ({"start_method": "spawn"}, "start_method must be one of"),
                                          ({"args": (threading.Lock(),)}, "cannot be pickled")])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch(report_and_print, 2, **kwargs)


def test_bad_string_targets():
    with pytest.raises(ValueError, match="package.module:function"):
        launch("labkit.comm.demos.all_reduce_sum", 2)
    with pytest.raises(ValueError, match="cannot import"):
        launch("labkit.comm.demos:no_such_function", 2)


# ---- the backend rule, applied before any process starts
def test_explicit_nccl_on_too_few_gpus_is_refused_up_front(gpus):
    gpus(1)
    with pytest.raises(ValueError, match=r"one CUDA GPU per rank: 2 rank\(s\) on this node but 1 GPU\(s\)"):
        launch(report_and_print, 2, backend="nccl")


# ---- SIGTERM: like Ctrl-C, no live workers and no temp dir with the pickled payload left behind
@pytest.mark.parametrize("start_method,processes", [("fresh", 2), ("forkserver", 3)])
def test_sigterm_to_the_launcher_kills_workers_and_removes_the_temp_dir(tmp_path, start_method, processes):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with parent_of_sleeping_ranks(tmp_path, start_method, env={**os.environ, "TMPDIR": str(tmp)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as (parent, kids):
        assert len(kids) == processes and list(tmp.glob("labkit-launch-*"))
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 143
        gone, alive = psutil.wait_procs(kids, timeout=1)
        assert alive == [] and list(tmp.glob("labkit-launch-*")) == []


def test_a_launch_folder_left_by_a_killed_launcher_is_removed_by_the_next(tmp_path):
    import os
    import subprocess as sp

    from labkit.comm.launch import RUN_DIR_PREFIX, remove_orphaned_run_dirs

    dead = sp.Popen(["true"])
    dead.wait()                                            # a pid that no longer runs
    orphan = tmp_path / f"{RUN_DIR_PREFIX}{dead.pid}-abc"
    alive = tmp_path / f"{RUN_DIR_PREFIX}{os.getpid()}-def"
    for folder in (orphan, alive):
        folder.mkdir()
        (folder / "0.result").write_bytes(b"x")
    assert remove_orphaned_run_dirs(tmp_path) == [orphan]
    assert not orphan.exists() and alive.exists()
