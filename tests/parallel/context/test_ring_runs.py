"""Ring attention on real gloo ranks: exact, timed, measured; a run past its timeout leaves nothing behind."""
import os
import tempfile
from pathlib import Path

import psutil
import pytest

from labkit.comm.launch import RUN_DIR_PREFIX, LaunchTimeout
from labkit.parallel.context.ring_report import (MEMORY_BAND, exactness_errors, memory_rows, overlap_summary,
                                         overlap_verdict)
from labkit.parallel.context.ring_runs import VARIANTS, RingConfig, run_ring

CFG = RingConfig(check_seq=48, time_seq=192, memory_seq=2048, rounds=2)


@pytest.fixture(scope="module")
def ranks():
    return run_ring(CFG, 2, timeout_s=120)


def test_two_ranks_equal_full_attention_and_its_gradients(ranks):
    errors = exactness_errors(ranks, CFG)
    assert max(errors.values()) < 1e-12, errors


def test_the_serial_variant_timed_against_it_computes_the_same_attention(ranks):
    errors = exactness_errors(ranks, CFG, key="exact_serial")
    assert max(errors.values()) < 1e-12, errors


def test_every_variant_is_timed_every_round_and_summarised(ranks):
    for r in ranks:
        assert set(r["seconds"]) == set(VARIANTS) and all(len(v) == 2 for v in r["seconds"].values())
    summary = overlap_summary(ranks)
    assert summary["ideal ratio"] >= 1.0 and summary["serial/overlapped"] > 0
    assert overlap_verdict(ranks).state in ("checked", "failed", "INCONCLUSIVE")


def test_the_forward_peak_is_near_the_formula(ranks):
    rows = memory_rows(ranks, CFG)
    if not rows:
        pytest.skip("no resident-memory high-water mark on this system")
    for row in rows:
        assert row["in_band"], row
        assert row["unpacked_MiB"] / (1 + MEMORY_BAND) <= row["measured_MiB"] <= row["formula_MiB"] * (1 + MEMORY_BAND)


def test_a_run_past_its_timeout_is_killed_and_cleaned_up():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LaunchTimeout):
        run_ring(RingConfig(check_seq=64, time_seq=4096, rounds=50), 2, timeout_s=3)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left
    mine = [p for p in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*")]
    assert not mine


def test_a_world_size_the_zig_zag_split_cannot_use_is_one_line_before_any_rank_starts():
    """Issue 53: run_ring(RingConfig(), 3) failed with a 28-line error from inside the ranks."""
    started = []
    with pytest.raises(ValueError, match=r"check_seq=64 must be a multiple of 2 x world_size = 6") as err:
        run_ring(RingConfig(), 3, launcher=lambda *a, **k: started.append(a))
    assert "\n" not in str(err.value) and not started
    with pytest.raises(ValueError, match="world_size must be"):
        run_ring(RingConfig(), 0, launcher=lambda *a, **k: started.append(a))
