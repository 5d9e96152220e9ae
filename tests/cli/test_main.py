"""`python -m labkit ...` run as a person runs it: subprocesses, small sizes, output and exit codes checked.

Argument-validation edge cases also run in-process through `labkit.cli.main.main` (same parser, no torch start-up
per case); every subcommand has at least one real subprocess run and one subprocess usage error (exit 2).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from labkit.cli import main as cli

ENV = {**os.environ, "LABKIT_OFFLINE": "1", "LABKIT_MODE": "fast"}


def labkit(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run `python -m labkit ARGS` and return the finished process (text stdout/stderr)."""
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout_s)


def usage_error(argv: list[str], capsys) -> str:
    """Run the CLI in-process, expect exit status 2, and return what it printed on stderr."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:   # argparse's own errors
        code = exit_.code
    assert code == 2, f"{argv} should be a usage error (exit 2), got {code}"
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    return err


def available(name: str) -> bool:
    """True when this build of the CLI has the subcommand (its labkit pieces exist)."""
    return name in cli.build_parser()._subparsers._group_actions[0].choices


# ------------------------------------------------------------------------------------------ top level
def test_help_lists_subcommands_with_examples():
    proc = labkit("--help")
    assert proc.returncode == 0
    for name in ("doctor", "profile", "simulate", "memory"):
        assert name in proc.stdout
    assert "examples (`labkit ...` is the same command" in proc.stdout


def test_no_subcommand_and_unknown_subcommand_are_usage_errors(capsys):
    proc = labkit("frobnicate")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    assert cli.main([]) == 2 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["doctor", "sweep", "profile", "allreduce-bench", "simulate", "ladder"])
def test_every_subcommand_help_has_examples(name, capsys):
    if not available(name):
        pytest.skip(f"`{name}` is not in this build of the CLI (its labkit module is missing)")
    with pytest.raises(SystemExit) as exit_:
        cli.main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"python -m labkit {name}" in out


def test_doctor_keeps_its_flags():
    proc = labkit("doctor", "--json", "--no-network")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["mode"] == "fast"


def test_argument_types_and_table_formatting():
    import argparse

    from labkit.cli.common import format_bytes, format_table, int_list, jsonable, parse_bytes

    assert [parse_bytes(t) for t in ("4096", "64K", "1M", "2GiB", "1.5K")] == [4096, 65536, 2**20, 2 * 2**30, 1536]
    assert int_list("16, 32,64") == [16, 32, 64]
    for bad in ("12Q", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_bytes(bad)
    with pytest.raises(argparse.ArgumentTypeError) as fractional:   # used to become 1 byte in silence
        parse_bytes("1.5")
    assert str(fractional.value) == ("a size must be a whole number of bytes, got '1.5' = 1.5 bytes; write a whole "
                                     "number, or a unit that makes it whole (1.5K = 1536)")
    assert parse_bytes("0.5K") == 512
    with pytest.raises(argparse.ArgumentTypeError):
        int_list("8,0")
    assert [format_bytes(n) for n in (512, 1536, 2**20, None)] == ["512 B", "1.5 KiB", "1 MiB", "n/a"]
    table = format_table([{"a": 1, "b": 2.5}, {"a": 10, "b": None}], [("a", "a (n)", str), ("b", "b (s)", str)])
    assert table.splitlines()[0] == "a (n)  b (s)" and table.splitlines()[-1].split() == ["10", "None"]
    assert json.dumps(jsonable({"x": float("nan"), "y": (1, 2)})) == '{"x": null, "y": [1, 2]}'


# ------------------------------------------------------------------------------------------ simulate
def test_simulate_prints_steps_bytes_and_time():
    proc = labkit("simulate", "--algorithm", "ring", "--world-size", "4", "--size", "1K", "--show-steps", "8")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "checked: every worker's output equals the exact reduction" in out
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


# ------------------------------------------------------------------------------------------ profile
def test_profile_writes_a_trace_and_prints_the_summary(tmp_path):
    run_dir = tmp_path / "prof"
    proc = labkit("profile", "--model", "mlp", "--dataset", "digits", "--batch-size", "16", "--wait", "1",
                  "--warmup", "1", "--active", "2", "--run-dir", str(run_dir), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "Profiled 2 steps of 16 samples" in proc.stdout
    for word in ("forward", "backward", "optimizer", "ms/step", "operator", "ui.perfetto.dev"):
        assert word in proc.stdout
    traces = list(run_dir.glob("*.json"))
    assert traces and str(traces[0]) in proc.stdout


def test_profile_on_cpu_has_no_gpu_error_line_gpu_column_or_repeated_progress(tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("checks the CPU-only output; on a GPU the GPU column belongs in the table")
    proc = labkit("profile", "--model", "mlp", "--dataset", "synthetic", "--batch-size", "8", "--wait", "0",
                  "--warmup", "1", "--active", "2", "--run-dir", str(tmp_path), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "gpuGetDeviceCount" not in proc.stderr and "ERROR" not in proc.stderr
    assert "self CPU ms/step" in proc.stdout and "GPU ms/step" not in proc.stdout
    assert "profiling steps" not in proc.stderr   # stderr is a pipe here: no progress line at all, let alone repeats


def test_profile_default_run_dir_is_under_the_run_root(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_RUN_DIR", str(tmp_path))
    assert cli.main(["profile", "--model", "mlp", "--dataset", "synthetic", "--batch-size", "4", "--wait", "0",
                     "--warmup", "0", "--active", "1", "--json", "--no-progress"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    assert os.path.dirname(run_dir) == str(tmp_path / "profile") and os.path.basename(run_dir).startswith("mlp-b4-")


def test_profile_json(tmp_path, capsys):
    assert cli.main(["profile", "--model", "mlp", "--dataset", "synthetic", "--batch-size", "8", "--wait", "0",
                     "--warmup", "1", "--active", "1", "--run-dir", str(tmp_path), "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["profiled_steps"] == 1 and data["samples_per_step"] == 8
    assert data["step_time_median_s"] > 0 and sum(data["shares"].values()) == pytest.approx(1.0)
    assert all(os.path.exists(p) for p in data["trace_files"])
    assert "Traceback" not in captured.err


def test_profile_usage_errors_exit_2(capsys, tmp_path):
    proc = labkit("profile", "--active", "0")
    assert proc.returncode == 2 and "--active" in proc.stderr
    assert "fewer than the schedule needs" in usage_error(["profile", "--steps", "2", "--run-dir", str(tmp_path)],
                                                          capsys)
    assert "--batch-size" in usage_error(["profile", "--batch-size", "abc"], capsys)
    assert "invalid choice" in usage_error(["profile", "--model", "vgg99"], capsys)
    err = usage_error(["profile", "--run-dir", "/proc/no-such-dir"], capsys)   # a bad argument: one line, exit 2
    assert err.startswith("error: --run-dir: run_dir='/proc/no-such-dir' is not a writable directory")
    assert len(err.strip().splitlines()) == 1
    file_path = tmp_path / "a_file"
    file_path.write_text("")
    assert "--run-dir" in usage_error(["profile", "--run-dir", str(file_path)], capsys)
    if not __import__("torch").cuda.is_available():
        assert "no CUDA GPU" in usage_error(["profile", "--device", "cuda"], capsys)


# ------------------------------------------------------------------------------------------ sweep
SWEEP = ["sweep", "--model", "mlp", "--dataset", "digits", "--batch-sizes", "8,32", "--steps", "4",
         "--memory-budget", "64M", "--limit", "512", "--device", "cpu"]


def test_sweep_prints_every_batch_size_and_the_largest_that_fits():
    proc = labkit(*SWEEP)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for header in ("batch", "samples/s", "step ms", "peak memory", "val acc %"):
        assert header in out
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0] in ("8", "32")]
    assert {r[0] for r in rows} >= {"8", "32"}
    assert "largest batch that fits:" in out and "memory-model" in out and "finder trials" in out


def test_sweep_json_agrees_with_the_finder(capsys):
    from labkit.training.finder import find_max_batch
    from labkit.core.data import load_data
    from labkit.core.models import build_model

    assert cli.main(SWEEP + ["--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["batch_size"] for r in data["rows"]] == [8, 32]
    assert all(r["fits"] and r["samples_per_s"] > 0 and r["steps"] == 4 for r in data["rows"])
    assert all(0 <= r["val_accuracy"] <= 1 for r in data["rows"])
    digits = load_data("digits")
    direct = find_max_batch(build_model("mlp", 10, digits.image_shape), digits.image_shape, device="cpu",
                            memory_budget_bytes=64 * 2**20, limit=512, timing_steps=0)
    assert data["max_batch"] == direct.max_batch > 32


def test_sweep_says_when_the_dataset_not_memory_is_the_limit():
    from types import SimpleNamespace

    from labkit.cli.sweep import format_finder

    finder = SimpleNamespace(max_batch=4096, usable_bytes=2**30, method="memory-model", device="cpu", trials=[])
    text = format_finder({"finder": finder, "budget_bytes": 2**30, "budget_source": "RAM available now",
                          "limit": 4096, "train_samples": 1437, "dataset": "digits"})
    assert text.startswith("largest batch that fits: at least 4096 (the search stopped at --limit); memory is not the "
                           "limit here: the digits set has only 1437 samples, so every batch up to 1437 fits")


def test_sweep_usage_errors_exit_2(capsys):
    proc = labkit("sweep", "--batch-sizes", "16,x")
    assert proc.returncode == 2 and "--batch-sizes" in proc.stderr
    assert "--batch-sizes" in usage_error(["sweep", "--batch-sizes", "0,8"], capsys)
    assert "exceed" in usage_error(["sweep", "--dataset", "digits", "--batch-sizes", "99999", "--no-find-max"],
                                   capsys)
    assert "--safety-margin" in usage_error(["sweep", "--safety-margin", "1.5"], capsys)
    assert "--memory-budget" in usage_error(["sweep", "--memory-budget", "lots"], capsys)


# ------------------------------------------------------------------------------------------ allreduce-bench
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
    assert "--max-bytes" in usage_error(["allreduce-bench", "-b", "1M", "-e", "1K"], capsys)
    assert "at most" in usage_error(["allreduce-bench", "--world-size", "999", "--backend", "gloo"], capsys)
    if not __import__("torch").cuda.is_available():
        assert "nccl" in usage_error(["allreduce-bench", "--backend", "nccl"], capsys)


# ------------------------------------------------------------------------------------------ ladder
LADDER_SKIP = ["input_pipeline", "no_sync", "mixed_precision", "channels_last", "compile", "ddp"]


def test_ladder_runs_headless_and_writes_its_table(tmp_path):
    proc = labkit("ladder", "--model", "mlp", "--dataset", "digits", "--train-limit", "32", "--budget-epochs", "1",
                  "--batch-sizes", "8,16", "--skip", *LADDER_SKIP, "--device", "cpu", "--out", str(tmp_path),
                  "--json", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (tmp_path / "ladder.json").exists() and (tmp_path / "ladder.md").exists()
    assert json.loads((tmp_path / "ladder.json").read_text()) == data
    text = json.dumps(data)
    assert "naive" in text and "batch" in text and "skipped" in text


def test_ladder_usage_errors_exit_2(capsys):
    proc = labkit("ladder", "--skip", "warp_drive")
    assert proc.returncode == 2 and "--skip" in proc.stderr
    assert "budget_epochs" in usage_error(["ladder", "--budget-epochs", "0"], capsys)


def test_building_the_parser_loads_neither_torch_nor_tensorflow():
    """`labkit --help` imports every subcommand module to build the parser: none may load a framework."""
    code = ("import sys; from labkit.cli.main import build_parser; build_parser(); "
            "heavy = [m for m in ('torch', 'tensorflow') if m in sys.modules]; assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
