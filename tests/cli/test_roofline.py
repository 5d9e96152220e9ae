"""`labkit roofline`: a real run at tiny sizes (table and JSON), and usage errors with one line and exit 2."""
from __future__ import annotations

import json

import pytest

from tests.cli.support import labkit, usage_error

TINY = ["--max-matmul", "128", "--bandwidth-bytes", "1M", "--repeats", "2", "--steps", "1", "--no-progress"]


def test_json_has_the_roofs_and_the_top_operators_with_their_bound():
    proc = labkit("roofline", "--model", "transformer", "--batch-size", "2", "--seq-len", "8", "--d-model", "16",
                  "--top", "5", "--json", *TINY)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {r["roof"] for r in out["roofs"]} >= {"matmul fp32", "copy", "triad"}
    assert out["ridge_flops_per_byte"] > 0 and len(out["top_ops"]) == 5
    assert all(op["bound"] in ("compute", "memory") and op["time_s"] > 0 for op in out["top_ops"])


def test_table_names_the_ridge_point_and_says_a_cpu_has_no_datasheet():
    proc = labkit("roofline", "--batch-size", "2", "--image-size", "8", "--top", "3", *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "ridge point:" in proc.stdout and "no datasheet figure for a CPU" in proc.stdout
    assert "Top 3 operators of a resnet18 training step" in proc.stdout


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
