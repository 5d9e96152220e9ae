"""`python -m labkit memory` as a subprocess: JSON breakdown, table, and one-line errors with exit 2.

Runs labkit.cli.main.main with the memory subcommand registered (a no-op once cli.py lists labkit.cli.memory).
"""
import json
import subprocess
import sys

import pytest

RUNNER = ("import sys, labkit.cli.main as c\n"
          "if 'labkit.cli.memory' not in c.SUBCOMMAND_MODULES:\n"
          "    c.SUBCOMMAND_MODULES = (*c.SUBCOMMAND_MODULES, 'labkit.cli.memory')\n"
          "sys.exit(c.main(sys.argv[1:]))")


def _run(*args):
    return subprocess.run([sys.executable, "-c", RUNNER, "memory", *args], capture_output=True, text=True,
                          timeout=120)


def test_json_per_rank_breakdown():
    out = _run("--model", "small_cnn", "--world-size", "4", "--strategy", "zero2", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    (rank,) = report["ranks"]
    assert rank["strategy"] == "zero2" and report["world_size"] == 4
    param_bytes = report["num_params"] * 4
    assert rank["grads_bytes"] == param_bytes // 4 and rank["params_bytes"] == param_bytes * 5 // 4
    assert rank["total_bytes"] == sum(rank[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                        "activations_bytes"))
    assert rank["comm_bytes_sent_per_step"] == pytest.approx(2 * 0.75 * param_bytes)


def test_table_lists_every_strategy():
    out = _run("--model", "mlp", "--world-size", "2")
    assert out.returncode == 0, out.stderr
    for name in ("ddp", "zero1", "zero2", "zero3", "total/rank", "sent/step"):
        assert name in out.stdout


@pytest.mark.parametrize("args, message", [(("--world-size", "0"), "--world-size"),
                                           (("--strategy", "zero9"), "--strategy"),
                                           (("--world-size", "100000"), "--world-size 100000 is more than")])
def test_bad_arguments_exit_2_with_one_error_line(args, message):
    out = _run("--model", "small_cnn", *args)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], out.stderr
    assert "Traceback" not in out.stderr
