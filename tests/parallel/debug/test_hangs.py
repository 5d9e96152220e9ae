"""Provoked hangs on real gloo ranks: each ends within its timeout, the reader names the culprit, nothing is left."""
from __future__ import annotations

import tempfile
from pathlib import Path

import psutil
import pytest

from labkit.parallel.debug.hangs import provoke


def leftovers(before: set[int]) -> tuple[list[int], list[str]]:
    """Processes this test process started that still run, and hang folders left in the temp folder."""
    kids = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    return kids, [p.name for p in Path(tempfile.gettempdir()).glob("labkit-hang-*")]


@pytest.mark.parametrize("bad", [dict(scenario="nope"), dict(scenario="skipped", tool="nope"),
                                 dict(scenario="skipped", world_size=1), dict(scenario="skipped", culprit=5),
                                 dict(scenario="skipped", hang_step=3, steps=3),
                                 dict(scenario="skipped", pg_timeout_s=0)])
def test_bad_input_is_one_clear_error(bad):
    with pytest.raises(ValueError):
        provoke(**bad)


def test_a_skipped_collective_times_out_and_the_flight_record_names_the_rank():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    ev = provoke("skipped", world_size=3, pg_timeout_s=2.0, timeout_s=60)
    assert ev.hung and "timed out" in ev.first_error().lower() and not ev.error_names(2)
    assert 1.5 < ev.max_waited_s() < 30
    assert ev.divergence.culprits == (2,) and ev.divergence.kind == "missing"
    assert ev.wall_s < 60
    assert leftovers(before) == ([], [])


def test_a_straggler_is_named_by_monitored_barrier_and_its_stack_shows_the_loader():
    ev = provoke("straggler", "monitored_barrier", world_size=3, pg_timeout_s=2.0, timeout_s=60)
    assert ev.error_names(2) and "monitoredBarrier" in ev.first_error() + str(ev.errors)
    assert "_loader_batch" in ev.stack


def test_error_rows_drop_gloos_source_path_and_an_empty_record_is_not_judged():
    from labkit.parallel.debug.flight_recorder import Divergence
    from labkit.parallel.debug.hangs import HangEvidence

    err = "RuntimeError: [/__w/pytorch/third_party/gloo/unbound_buffer.cc:78] Timed out waiting 2000ms for recv"
    ev = HangEvidence("skipped", "default", 2, 3, 2.0, 5.0, "rank 0 failed", {0: {"error": err, "waited_s": 2.014}},
                      Divergence(None, (), "agree", None), "", "gloo", {0: [], 1: [], 2: []}, {})
    assert ev.error_rows() == [{"rank": 0, "waited (s)": 2.01,
                                "error (first line)": "RuntimeError: Timed out waiting 2000ms for recv"}]
    assert "recorded nothing" in ev.recorder_missing_reason() and ev.max_waited_s() == 2.014
    assert not ev.error_names(2) and ev.first_error().startswith("RuntimeError")


def test_ddp_with_a_parameter_one_rank_did_not_use_raises_there_and_info_names_the_parameters():
    ev = provoke("unused", "info", world_size=3, pg_timeout_s=2.0, timeout_s=60)
    named = [ln for ln in ev.errors[2]["error"].splitlines() if "Parameters which did not receive grad" in ln]
    assert named and "aux.weight" in named[0] and "body.weight" not in named[0]
    assert ev.divergence.culprits == (2,)
