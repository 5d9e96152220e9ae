"""`labkit allreduce-bench`: the nccl-tests layout on real gloo processes, busbw = algbw x 2(n-1)/n."""
from __future__ import annotations

import json

import pytest

from labkit.cli import main as cli

from tests.cli.support import labkit, usage_error


def test_allreduce_bench_prints_the_nccl_tests_layout():
    proc = labkit("allreduce-bench", "--world-size", "2", "--sizes", "1K,64K", "-n", "3", "-w", "1",
                  "--backend", "gloo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "# all_reduce, 2 ranks, gloo" in out
    for column in ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "(us)", "(GB/s)"):
        assert column in out
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [1024, 65536] and [int(r[1]) for r in rows] == [256, 16384]
    assert all(r[-1] == "0" for r in rows)                       # no wrong elements
    assert "# Out of bounds values : 0 OK" in out


def test_allreduce_bench_json_busbw_is_algbw_times_2_n_minus_1_over_n(capsys):
    assert cli.main(["allreduce-bench", "-g", "2", "-b", "16", "-e", "256", "-f", "4", "-n", "2", "-w", "0",
                     "--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in data["rows"]] == [16, 64, 256]
    for r in data["rows"]:
        assert r["busbw_gb_s"] == pytest.approx(r["algbw_gb_s"] * 2 * (2 - 1) / 2)
        assert r["algbw_gb_s"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["wrong"] == 0


def test_allreduce_bench_usage_errors_exit_2(capsys):
    proc = labkit("allreduce-bench", "--world-size", "0")
    assert proc.returncode == 2 and "--world-size" in proc.stderr
    assert "whole float32 elements" in usage_error(["allreduce-bench", "--sizes", "6"], capsys)
    assert usage_error(["allreduce-bench", "--sizes", "1K 64K"], capsys).endswith(
        ": error: argument --sizes: give the numbers separated by commas, e.g. 1K,64K; got '1K 64K'\n")
    assert "--max-bytes" in usage_error(["allreduce-bench", "-b", "1M", "-e", "1K"], capsys)
    assert "at most" in usage_error(["allreduce-bench", "--world-size", "999", "--backend", "gloo"], capsys)
    if not __import__("torch").cuda.is_available():
        assert "nccl" in usage_error(["allreduce-bench", "--backend", "nccl"], capsys)


def test_its_own_timeout_keeps_and_prints_the_sizes_that_finished(tmp_path):
    """--timeout-s fires part-way: the finished sizes are printed and on disk; exit 1; 'after N of 3'."""
    results = tmp_path / "rows.jsonl"
    proc = labkit("allreduce-bench", "--sizes", "1K,2K,128M", "-n", "1000", "-w", "0", "--timeout-s", "20",
                  "--results", str(results), "--no-progress")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert 1 <= len(rows) < 3 and f"timed out after {len(rows)} of 3 message sizes; results so far in {results}" \
        in proc.stderr
    assert "--timeout-s=20" in proc.stderr and "timeout_s" not in proc.stderr
    assert proc.stdout.splitlines()[3].split()[0] == "1024"


def test_a_disk_that_fills_mid_run_prints_every_size_and_says_how_many_the_file_holds(tmp_path):
    """One free page on a real tmpfs: the first row fits, the second rewrite does not; the table is whole,
    one line says the file holds 1 of 3 sizes, exit 1, no temp file."""
    import os

    from tests.fault_support import fill, tiny_tmpfs

    with tiny_tmpfs(tmp_path) as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        fill(mount)
        filler = mount / "filler"
        os.truncate(filler, filler.stat().st_size - 4096)       # room for one page: one row, not two
        results = mount / "rows.jsonl"
        proc = labkit("allreduce-bench", "--sizes", "1K,2K,4K", "-n", "2", "-w", "0", "--results", str(results),
                      "--no-progress")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert [line.split()[0] for line in proc.stdout.splitlines()[3:6]] == ["1024", "2048", "4096"]
        assert proc.stderr.strip() == (f"error: cannot write {results}: the disk is full (ENOSPC); it holds the "
                                       "first 1 of 3 message sizes printed above")
        assert [json.loads(line)["size_bytes"] for line in results.read_text().splitlines()] == [1024]
        assert sorted(p.name for p in mount.iterdir()) == ["filler", "rows.jsonl"]


def test_a_rank_killed_mid_run_keeps_and_prints_the_sizes_that_finished(tmp_path):
    """A real SIGKILL to one rank after the first size: the finished sizes are printed and on disk, exit 1."""
    import subprocess
    import sys
    import time

    import psutil

    from tests.cli.support import ENV

    results = tmp_path / "rows.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "allreduce-bench", "--sizes", "1K,2K,64M", "-n", "5000",
                             "-w", "0", "--results", str(results), "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 180
        while not (results.exists() and results.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True) if not p.children()]
        ranks[-1].kill()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert proc.returncode == 1 and 1 <= len(rows) < 3, err
    assert err.startswith(f"stopped by a failure after {len(rows)} of 3 message sizes; results so far in {results}: "
                          "rank ") and "killed by SIGKILL" in err
    assert out.splitlines()[3].split()[0] == "1024"


def test_sigterm_while_the_rank_server_starts_stops_before_any_size_is_measured(tmp_path):
    """issue 53: `allreduce-bench & sleep 1.5; kill $!` ended 6.6 s later with 7 of 8 sizes measured after the
    signal. Signalled as its rank forkserver starts (before any rank is forked), it measures nothing and leaves
    no process behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from labkit.comm.stop import stop_group, wait_vanished
    from tests.cli.support import ENV

    rows = tmp_path / "rows.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "allreduce-bench", "--sizes", "1K,4K,16K,64K",
                             "--no-progress", "--results", str(rows)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        deadline, server = time.monotonic() + 120, None
        while server is None and time.monotonic() < deadline and proc.poll() is None:
            for kid in psutil.Process(proc.pid).children():
                try:
                    if "serve_forks" in " ".join(kid.cmdline()):
                        server = kid
                except psutil.Error:
                    pass
            time.sleep(0.005)
        assert server is not None, "the forkserver never started"
        unforked = server.children() == []
        signalled = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took_s = time.monotonic() - signalled
        assert proc.returncode == 143 and err.strip().splitlines()[-1].startswith("terminated (SIGTERM)"), err
        assert "Traceback" not in err
        if unforked:                         # no rank existed at the signal: any row was measured after it
            assert not rows.exists(), rows.read_text()
        assert wait_vanished([server], 5) == []
        print(f"stopped {took_s:.1f} s after the signal; ranks forked before it: {not unforked}")
        assert took_s < 15                   # a bound on a hang (busy machine); the rows decide
    finally:
        stop_group(proc)
