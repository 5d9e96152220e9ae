"""`labkit roofline`: a real run at tiny sizes (table and JSON), and usage errors with one line and exit 2."""
from __future__ import annotations

import json

import pytest

from tests.cli.support import labkit, usage_error

TINY = ["--max-matmul", "128", "--bandwidth-bytes", "1M", "--repeats", "2", "--steps", "1", "--no-progress"]


def test_json_has_the_roofs_and_the_top_operators_with_their_bound(tmp_path):
    proc = labkit("roofline", "--model", "transformer", "--batch-size", "2", "--seq-len", "8", "--d-model", "16",
                  "--top", "5", "--json", "--results", str(tmp_path / "r.jsonl"), *TINY)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {r["roof"] for r in out["roofs"]} >= {"matmul fp32", "copy", "triad"}
    assert out["ridge_flops_per_byte"] > 0 and len(out["top_ops"]) == 5
    assert all(op["bound"] in ("compute", "memory") and op["time_s"] > 0 for op in out["top_ops"])


def test_table_names_the_ridge_point_and_says_a_cpu_has_no_datasheet(tmp_path):
    results = tmp_path / "roofline.jsonl"
    proc = labkit("roofline", "--batch-size", "2", "--image-size", "8", "--top", "3", "--results", str(results), *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "ridge point:" in proc.stdout and "no datasheet figure for a CPU" in proc.stdout
    assert "Top 3 operators of a resnet18 training step" in proc.stdout
    assert [json.loads(line)["part"] for line in results.read_text().splitlines()] == ["roofs", "operators"]


def test_a_real_ctrl_c_during_the_operators_prints_and_keeps_the_roofs(tmp_path):
    """SIGINT once the roofs are saved (the operators take long): roofs printed and on disk, exit 130, 1 of 2."""
    import signal
    import subprocess
    import sys
    import time

    from tests.cli.support import ENV

    results = tmp_path / "roofline.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "roofline", "--batch-size", "2", "--image-size", "8",
                             "--results", str(results), *TINY[:-3], "--steps", "100000", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "PYTHONFAULTHANDLER": "1"})
    try:
        deadline = time.monotonic() + 180
        while not (results.exists() and results.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:       # once in CI: say where it was stuck (faulthandler dumps on SIGABRT)
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"no exit within 60 s of Ctrl-C; every thread's stack:\n{err[-6000:]}")
    finally:
        proc.kill()
    assert proc.returncode == 130 and "ridge point:" in out and "matmul fp32" in out, err
    assert err.strip().endswith(f"interrupted (Ctrl-C) after 1 of 2 parts (the roofs, then the operators); "
                                f"results so far in {results}")
    assert [json.loads(line)["part"] for line in results.read_text().splitlines()] == ["roofs"]


@pytest.mark.parametrize("argv, message", [
    (["roofline", "--batch-size", "0"], "positive integer"),
    (["roofline", "--bandwidth-bytes", "1.5"], "whole number of bytes"),
    (["roofline", "--model", "vgg"], "invalid choice"),
    (["roofline", "--d-model", "10", *TINY], "multiple of 4"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert message in usage_error(argv, capsys)


def test_help_has_examples():
    proc = labkit("roofline", "--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout and "labkit roofline --json" not in proc.stdout
