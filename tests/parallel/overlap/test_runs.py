"""Overlap on 2 real gloo ranks: the naive, per-parameter and bucketed syncs give DDP's gradients; the timed
variants report their rounds and timelines; a run past its timeout leaves no process or folder behind."""
import math
import os
import tempfile
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from labkit.comm.launch import RUN_DIR_PREFIX, LaunchTimeout, launch
from labkit.parallel.overlap.grad_sync import GradSync
from labkit.parallel.overlap.runs import (OverlapConfig, build_mlp, rank_batch, run_gradient_check,
                                          run_overlap_timing, variant_names)

SMOKE = OverlapConfig.smoke()


@pytest.fixture(scope="module")
def timed():
    return run_overlap_timing(SMOKE, 2, timeout_s=120)


def test_every_hand_written_sync_equals_ddp_on_two_ranks():
    ranks = run_gradient_check(SMOKE, 2, timeout_s=120, cap_bytes=16 << 10)
    for r in ranks:
        assert set(r["gaps"]) == {"naive", "per_param", "bucketed"}
        assert max(r["gaps"].values()) < 1e-6, r["gaps"]     # fp32 sums of 2 numbers: the same order as DDP's
        # 3 layers of 64x64 + 64: per parameter 6 buckets; 16 KiB closes at each weight (16 KiB): 3; naive 1
        assert r["buckets"] == {"naive": 1, "per_param": 6, "bucketed": 3}


def test_each_variant_is_timed_every_round_with_its_timeline(timed):
    assert [r["rank"] for r in timed] == [0, 1]
    for r in timed:
        assert 0 < r["cpu_share"] <= 1 and r["fit"]["beta_s_per_byte"] > 0
        assert list(r["rounds"]) == variant_names(SMOKE) == ["none", "naive", "cap=0", "cap=16384", "cap=inf"]
        for name, rows in r["rounds"].items():
            assert len(rows) == SMOKE.rounds
            step = rows[-1]
            assert [n for n, _, _ in step["layers"]] == ["4", "2", "0"]
            assert step["step_s"] >= step["backward_s"] > 0
            assert (step["buckets"] == []) == (name == "none")
            assert all(launch <= finish for _, _, launch, finish in step["buckets"])
        assert sum(b[1] for b in r["rounds"]["cap=0"][-1]["buckets"]) == SMOKE.grad_bytes
        assert r["bucket_layers"]["cap=inf"] == [["4", "4", "2", "2", "0", "0"]]


def test_the_ranks_split_one_global_batch_and_build_one_model():
    x0, _ = rank_batch(SMOKE, 0, 2)
    x1, _ = rank_batch(SMOKE, 1, 2)
    assert x0.shape == (4, 64) and not (x0 == x1).all()
    a, b = build_mlp(SMOKE), build_mlp(SMOKE)
    assert all((p == q).all() for p, q in zip(a.parameters(), b.parameters()))
    assert SMOKE.grad_bytes == sum(4 * p.numel() for p in a.parameters())


def test_bad_configs_are_refused():
    with pytest.raises(ValueError):
        OverlapConfig(caps_bytes=(-1,))
    with pytest.raises(ValueError):
        OverlapConfig(depth=0)
    with pytest.raises(ValueError, match="does not split"):
        rank_batch(OverlapConfig(batch=5), 0, 2)
    assert math.isinf(OverlapConfig().caps_bytes[-1])


def test_a_run_past_its_timeout_is_killed_and_leaves_no_process_or_folder():
    before = set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*"))
    with pytest.raises(LaunchTimeout):
        run_overlap_timing(SMOKE, 2, timeout_s=0.3)
    assert psutil.Process().children(recursive=True) == []
    assert set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*")) == before


def unused_parameter_worker() -> str:
    """A rank whose loss leaves one layer out: the sync must say so instead of hanging or passing."""
    model = nn.ModuleDict({"used": nn.Linear(4, 4), "unused": nn.Linear(4, 4)})
    sync = GradSync(model, "per_param")
    model["used"](torch.randn(2, 4)).sum().backward()
    try:
        sync.finish()
    except RuntimeError as err:
        return str(err)
    return "no error"


def test_a_parameter_left_out_of_the_loss_is_named_not_waited_for():
    said = launch(unused_parameter_worker, 2, timeout_s=60, show_output=False)
    assert all("never received all their gradients" in s for s in said), said


def test_a_flat_all_reduce_fit_is_measured_again_with_more_repeats_then_named(world_of_one):
    """A busy CI run once measured the all-reduce's slope below zero and the rank died; the fit is now re-measured
    with twice the repeats, and a third flat slope is one line that names the medians."""
    from unittest import mock

    from labkit.parallel.overlap import runs as runs_mod
    flat = {n: 1e-3 - n * 1e-11 for n in runs_mod.FIT_SIZES_BYTES}     # a slope below zero
    seen = []

    def medians(sizes, repeats):
        seen.append(repeats)
        return flat if len(seen) < 3 else {n: 1e-4 + n * 1e-9 for n in sizes}

    with mock.patch.object(runs_mod, "_allreduce_medians", medians):
        fit = runs_mod.fit_allreduce(repeats=2)
    assert seen == [2, 4, 8] and fit["repeats"] == 8 and fit["beta_s_per_byte"] == pytest.approx(1e-9)
    with mock.patch.object(runs_mod, "_allreduce_medians", lambda sizes, repeats: flat), \
            pytest.raises(ValueError, match="did not grow with its size in 3 tries"):
        runs_mod.fit_allreduce(repeats=2)


def test_the_all_reduce_medians_cover_every_size_on_a_real_group(world_of_one):
    from labkit.parallel.overlap.runs import _allreduce_medians
    times = _allreduce_medians((4 << 10, 64 << 10), 3)
    assert list(times) == [4 << 10, 64 << 10] and all(t > 0 for t in times.values())
