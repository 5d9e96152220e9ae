"""Atomic files, rows saved as they finish, and work stopped part-way: on a real full and read-only tmpfs, with
real signals."""
import errno
import json
import os
import signal

import pytest

from labkit.core import results
from labkit.core.results import (ResultStream, StoppedEarly, Terminated, WriteError, atomic_path, atomic_write_text,
                                 keep_finished, read_json_lines, sigterm_as_interrupt)

from tests.fault_support import fill, raise_enospc, remount_read_only, tiny_tmpfs


def test_atomic_write_replaces_whole_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "out.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_failed_writer_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "out.json"
    atomic_write_text(path, "old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_full_disk_is_one_line_naming_path_and_cause(tmp_path, monkeypatch):
    with tiny_tmpfs(tmp_path) as mount:
        if mount is None:                       # no mount allowed here: the same errno from a stand-in write
            monkeypatch.setattr(results.os, "fsync", raise_enospc)
            mount = tmp_path
        else:
            (mount / "ladder.json").write_text('{"old": 1}')
            fill(mount)
        target = mount / "ladder.json"
        with pytest.raises(WriteError) as err:
            atomic_write_text(target, json.dumps({"rows": list(range(100_000))}))
        assert str(err.value) == f"cannot write {target}: the disk is full (ENOSPC)"
        assert not [p for p in mount.iterdir() if p.name.endswith(".tmp")]
        if target.exists():
            assert json.loads(target.read_text()) == {"old": 1}      # the old file, whole


def test_a_read_only_disk_is_one_line(tmp_path):
    with tiny_tmpfs(tmp_path) as mount:
        if mount is None or not remount_read_only(mount):
            pytest.skip("cannot mount or remount a tmpfs here (needs root)")
        with pytest.raises(WriteError, match=r"the file system is read-only \(EROFS\)$"):
            atomic_write_text(mount / "x.json", "{}")


def test_a_first_row_that_cannot_be_saved_leaves_no_empty_folder(tmp_path, monkeypatch):
    with tiny_tmpfs(tmp_path) as mount:
        if mount is None:                       # no mount allowed here: the same errno from a stand-in write
            monkeypatch.setattr(results.os, "fsync", raise_enospc)
            mount = tmp_path
        else:
            fill(mount)
        stream = ResultStream(mount / "ladder" / "deeper" / "ladder.jsonl", 10, "rungs")
        with pytest.raises(WriteError, match="disk is full"):
            stream.add({"rung": 0})
        assert not (mount / "ladder").exists() and stream.rows == [{"rung": 0}] and stream.saved == 0


def test_describe_os_error_names_the_common_causes():
    for code, words in ((errno.EACCES, "permission denied"), (errno.EROFS, "read-only"), (errno.ENOSPC, "full")):
        assert words in results.describe_os_error("/p", OSError(code, os.strerror(code)))


def test_stream_keeps_every_finished_row_and_says_what_did_not_finish(tmp_path):
    stream = ResultStream(tmp_path / "sub" / "rows.jsonl", 6, "batch sizes")
    shown = []
    with pytest.raises(StoppedEarly) as stop:
        with keep_finished(stream, shown.extend):
            for batch in (16, 32, 64, 128):
                stream.add({"batch": batch})
            raise KeyboardInterrupt
    assert stop.value.code == 130 and shown == [{"batch": b} for b in (16, 32, 64, 128)]
    assert str(stop.value) == f"interrupted (Ctrl-C) after 4 of 6 batch sizes; results so far in {stream.path}"
    assert read_json_lines(stream.path) == shown


@pytest.mark.parametrize("error, code, words", [(Terminated(), 143, "terminated (SIGTERM)"),
                                                (TimeoutError("took too long"), 1, "timed out after 1 of 2"),
                                                (WriteError("cannot write x: full"), 1, "could not be saved")])
def test_stream_exit_codes_follow_the_shell(tmp_path, error, code, words):
    stream = ResultStream(tmp_path / "rows.jsonl", 2, "rungs")
    with pytest.raises(StoppedEarly) as stop:
        with keep_finished(stream, lambda rows: None):
            stream.add({"rung": 0})
            raise error
    assert stop.value.code == code and words in str(stop.value)


def test_a_failure_after_finished_rows_keeps_them_and_a_timeout_stays_a_timeout(tmp_path):
    class RankDied(RuntimeError):
        pass

    class RankTimeout(RankDied, TimeoutError):
        pass

    for error, start in ((RankDied("rank 1 was killed\ntraceback"), "stopped by a failure after 1 of 3 sizes"),
                         (RankTimeout("too slow"), "timed out after 1 of 3 sizes")):
        stream, shown = ResultStream(tmp_path / "rows.jsonl", 3, "sizes"), []
        with pytest.raises(StoppedEarly) as stop:
            with keep_finished(stream, shown.extend, failures=(RankDied,)):
                stream.add({"size": 1})
                raise error
        assert stop.value.code == 1 and str(stop.value).startswith(start) and shown == [{"size": 1}]
    assert str(stop.value).endswith("(too slow)")
    with pytest.raises(RankDied):                   # nothing finished: the failure itself, unchanged
        with keep_finished(ResultStream(None, 3, "sizes"), shown.extend, failures=(RankDied,)):
            raise RankDied("at once")


def test_nothing_finished_points_at_no_file(tmp_path):
    stream = ResultStream(tmp_path / "rows.jsonl", 3, "sizes")
    assert stream.stopped("timed out") == "timed out after 0 of 3 sizes" and not stream.path.exists()


def test_a_real_sigterm_unwinds_like_ctrl_c():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000_000):        # the handler runs between bytecodes
                pass
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_swallowed_sigterm_stops_the_work_at_the_next_finished_row(tmp_path):
    """Python swallows an exception raised in a fork hook or finaliser; the next row raises the SIGTERM again."""
    stream = ResultStream(tmp_path / "rows.jsonl", 3, "rungs")
    with pytest.raises(StoppedEarly) as stop:
        with sigterm_as_interrupt(), keep_finished(stream, lambda rows: None):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10_000_000):
                    pass
            except Terminated:
                pass                            # what "Exception ignored in ..." amounts to
            stream.add({"rung": 0})
            pytest.fail("the swallowed SIGTERM was lost")
    assert stop.value.code == 143 and read_json_lines(stream.path) == [{"rung": 0}]
