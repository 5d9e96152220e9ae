"""`labkit simulate`: steps, bytes per worker and modelled time, checked against the closed form."""
from __future__ import annotations

import json

import pytest

from tests.cli.support import labkit, usage_error


def test_simulate_prints_steps_bytes_and_time():
    proc = labkit("simulate", "--algorithm", "ring", "--world-size", "4", "--size", "1K", "--show-steps", "8")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "checked: every worker holds the identical bits; each output is within the rounding bound" in out
    assert "ring" in out and "modelled ms" in out and "bytes sent per worker" in out
    assert "reduce-scatter" in out and "0 -> 1" in out
    assert out.count("1.5 KiB") >= 5   # the ring sends 2(R-1)/R = 1.5x the array from every worker


def test_simulate_json_matches_the_closed_form():
    from labkit.comm.collectives import allreduce_cost

    proc = labkit("simulate", "--algorithm", "all", "--world-size", "8", "--size", "64K", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["world_size"] == 8
    by_algo = {r["algorithm"]: r for r in data["results"]}
    assert set(by_algo) == {"naive", "tree", "ring", "halving_doubling"}
    alpha, beta = data["latency_s"], 1 / data["bandwidth_bytes_per_s"]
    for name, row in by_algo.items():
        assert row["modelled_time_s"] == pytest.approx(allreduce_cost(name, 8, 65536, alpha, beta, itemsize=4))
    assert by_algo["ring"]["max_bytes_sent"] == 2 * 7 * 65536 // 8
    assert by_algo["naive"]["max_bytes_sent"] == 7 * 65536


def test_simulate_usage_errors_exit_2(capsys):
    proc = labkit("simulate", "--world-size", "0")
    assert proc.returncode == 2 and "--world-size" in proc.stderr and "Traceback" not in proc.stderr
    assert "power-of-two" in usage_error(["simulate", "--algorithm", "halving_doubling", "--world-size", "6"], capsys)
    assert "--size" in usage_error(["simulate", "--size", "12Q"], capsys)
    assert "whole number" in usage_error(["simulate", "--size", "10"], capsys)
    assert "in memory" in usage_error(["simulate", "--world-size", "8", "--size", "1G"], capsys)
    assert "invalid choice" in usage_error(["simulate", "--algorithm", "butterfly"], capsys)
    assert "--latency-us" in usage_error(["simulate", "--latency-us", "-1"], capsys)


def test_half_precision_on_8_to_32_workers_passes_and_says_why():
    """Summation order changes the rounding (within the bound of its depth); every rank still agrees bitwise."""
    for world_size in ("8", "32"):
        proc = labkit("simulate", "--algorithm", "all", "--dtype", "float16", "--world-size", world_size,
                      "--size", "4K", "--json")
        assert proc.returncode == 0, proc.stderr
        for row in json.loads(proc.stdout)["results"]:
            assert row["ranks_identical"] and row["max_abs_error"] <= row["max_error_bound"]
