"""The flight-recorder reader on hand-made records (every verdict), on a real gloo dump, and the stack reader."""
from __future__ import annotations

import pickle

from labkit.parallel.debug.flight_recorder import (FR_ENV, Entry, diagnose, entries_of, read_dumps, recorder_env,
                                             stuck_stack)


def rec(*calls: tuple[str, int]) -> list[Entry]:
    """Entries #1, #2, ... for (op, size) pairs."""
    return [Entry(i + 1, op, ((n,),) if n else (), "") for i, (op, n) in enumerate(calls)]


def test_a_rank_that_skipped_a_collective_is_named_with_the_sequence_id():
    full = rec(("all_reduce", 1), ("all_reduce", 64), ("all_reduce", 1))
    d = diagnose({0: full, 1: full, 2: full[:2]})
    assert (d.seq, d.culprits, d.kind) == (3, (2,), "missing")
    assert "rank 2 never entered it" in d.report() and "#3 all_reduce[[1]]" in d.report()


def test_a_rank_that_called_another_op_or_size_is_named():
    good = rec(("all_reduce", 1), ("all_reduce", 64))
    assert diagnose({0: good, 1: rec(("all_reduce", 1), ("barrier", 0)), 2: good}).culprits == (1,)
    d = diagnose({0: good, 1: good, 2: rec(("all_reduce", 1), ("all_reduce", 65))})
    assert (d.seq, d.culprits, d.kind) == (2, (2,), "different call")


def test_ranks_that_stopped_early_leave_the_odd_rank_waiting_alone():
    d = diagnose({0: rec(("all_reduce", 4), ("all_reduce", 4)), 1: rec(("all_reduce", 4)),
                  2: rec(("all_reduce", 4))})
    assert (d.seq, d.culprits, d.kind) == (2, (0,), "waiting alone")
    assert "[1, 2] never entered" in d.report()


def test_agreeing_records_and_missing_dumps():
    same = rec(("all_reduce", 4))
    assert diagnose({0: same, 1: same}).kind == "agree"
    dead = diagnose({0: same, 1: None})
    assert (dead.kind, dead.culprits) == ("no dump", (1,)) and "died" in dead.report()


def test_entries_of_reads_torch_dump_entries_and_the_callers_line():
    dump = {"entries": [
        {"collective_seq_id": 2, "profiling_name": "gloo:all_reduce", "input_sizes": [[64]], "pg_id": 0,
         "is_p2p": False, "state": "scheduled",
         "frames": [{"name": "all_reduce", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 1},
                    {"name": "train", "filename": "/home/me/train.py", "line": 12}]},
        {"collective_seq_id": 1, "profiling_name": "gloo:broadcast", "input_sizes": [[3]], "pg_id": 0},
        {"collective_seq_id": 1, "profiling_name": "gloo:barrier", "input_sizes": [], "pg_id": 1}]}   # other group
    got = entries_of(dump)
    assert [(e.seq, e.op) for e in got] == [(1, "broadcast"), (2, "all_reduce")]
    assert got[1].where == "train.py:12 (train)" and str(got[1]) == "#2 all_reduce[[64]] at train.py:12 (train)"


def test_read_dumps_marks_a_rank_without_a_file(tmp_path):
    (tmp_path / "rank0.pkl").write_bytes(pickle.dumps({"entries": []}))
    assert read_dumps(tmp_path, 2) == {0: [], 1: None}
    assert recorder_env(5) == {FR_ENV: "5"}


def test_stuck_stack_reads_the_main_threads_frames_without_torchs(tmp_path):
    (tmp_path / "rank1.stack").write_text(
        "main thread 0x00000000000000aa\n"
        "Thread 0x00000000000000bb (most recent call first):\n  File \"/w/worker.py\", line 3 in _watch\n\n"
        "Current thread 0x00000000000000cc (most recent call first):\n  File \"/w/fr.py\", line 9 in dump\n\n"
        "Thread 0x00000000000000aa (most recent call first):\n"
        "  File \"/v/torch/distributed/distributed_c10d.py\", line 5 in all_reduce\n"
        "  File \"/w/loader.py\", line 7 in read_batch\n  File \"/w/train.py\", line 2 in main\n")
    assert stuck_stack(tmp_path, 1) == 'File "/w/loader.py", line 7 in read_batch\nFile "/w/train.py", line 2 in main'
    assert stuck_stack(tmp_path, 0) == ""
