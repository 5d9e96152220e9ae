"""`run_diagnosed`: a real hanging loop is reported by rank, call and stack within its timeout, leaving nothing."""
from __future__ import annotations

import tempfile
from pathlib import Path

import psutil
import pytest

from labkit.core.clock import now_s
from labkit.parallel.debug.diagnose import hold_for_peers, run_diagnosed

LOOP = "labkit.parallel.debug.hang_exercises:uneven_shards_loop"


def test_a_bad_target_fails_before_any_process_starts():
    with pytest.raises(ValueError):
        run_diagnosed("labkit.parallel.debug.hang_exercises:no_such_function")
    with pytest.raises(ValueError):
        run_diagnosed(LOOP, world_size=1)


def test_the_uneven_loop_is_reported_by_rank_call_and_stack():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    report = run_diagnosed(LOOP, 3, pg_timeout_s=2.0, timeout_s=60)
    text = report.text()
    assert not report.ok and report.divergence.culprits == (0,) and report.divergence.seq == 4
    assert "uneven_shards_loop" in text and "stack of rank 0" in text and "hang_exercises.py" in report.stacks[0]
    assert len(text.splitlines()) < 25
    assert [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    assert list(Path(tempfile.gettempdir()).glob("labkit-diagnose-*")) == []


def test_a_finished_rank_holds_its_sockets_until_every_rank_wrote_its_note_or_the_hold_ends(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text("{}")
    start = now_s()
    hold_for_peers(tmp_path, 2, hold_s=30.0)                     # everyone is done: no wait
    assert now_s() - start < 1.0
    start = now_s()
    hold_for_peers(tmp_path, 3, hold_s=0.5)                      # rank 2 never wrote its note: wait the hold, no more
    assert 0.5 <= now_s() - start < 5.0
