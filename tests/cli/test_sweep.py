"""`labkit sweep`: every batch size measured, the largest that fits, and what limits it."""
from __future__ import annotations

import json

from labkit.cli import main as cli

from tests.cli.support import labkit, usage_error

SWEEP = ["sweep", "--model", "mlp", "--dataset", "digits", "--batch-sizes", "8,32", "--steps", "4",
         "--memory-budget", "64M", "--limit", "512", "--device", "cpu"]


def test_sweep_prints_every_batch_size_and_the_largest_that_fits():
    proc = labkit(*SWEEP)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for header in ("batch", "samples/s", "ceiling samples/s", "of ceiling", "step ms", "peak memory", "val acc %"):
        assert header in out
    assert "ceiling: the same model, recipe and steps on real batches already on the device" in out
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0] in ("8", "32")]
    assert {r[0] for r in rows} >= {"8", "32"}
    assert "largest batch that fits:" in out and "memory-model" in out and "finder trials" in out


def test_sweep_json_agrees_with_the_finder(capsys):
    from labkit.core.data import load_data
    from labkit.core.models import build_model
    from labkit.training.finder import find_max_batch

    assert cli.main(SWEEP + ["--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["batch_size"] for r in data["rows"]] == [8, 32]
    assert all(r["fits"] and r["samples_per_s"] > 0 and r["steps"] == 4 for r in data["rows"])
    assert all(0 <= r["val_accuracy"] <= 1 for r in data["rows"])
    assert all(r["ceiling_samples_per_s"] > 0 and r["fraction_of_ceiling"] > 0 for r in data["rows"])
    assert all(abs(r["fraction_of_ceiling"] - r["samples_per_s"] / r["ceiling_samples_per_s"]) < 1e-9
               for r in data["rows"])
    assert "already on the device" in data["ceiling"]
    digits = load_data("digits")
    direct = find_max_batch(build_model("mlp", 10, digits.image_shape), digits.image_shape, device="cpu",
                            memory_budget_bytes=64 * 2**20, limit=512, timing_steps=0)
    assert data["max_batch"] == direct.max_batch > 32


def test_sweep_no_ceiling_skips_it(capsys):
    argv = SWEEP[:7] + ["--steps", "2", "--device", "cpu", "--no-find-max", "--no-ceiling", "--json", "--no-progress"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ceiling"] == "not measured (--no-ceiling)"
    assert all(r["ceiling_samples_per_s"] is None and r["fraction_of_ceiling"] is None for r in data["rows"])


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
    assert usage_error(["sweep", "--batch-sizes", "16 32"], capsys).endswith(
        ": error: argument --batch-sizes: give the numbers separated by commas, e.g. 16,32; got '16 32'\n")
    assert "exceed" in usage_error(["sweep", "--dataset", "digits", "--batch-sizes", "99999", "--no-find-max"],
                                   capsys)
    assert "--safety-margin" in usage_error(["sweep", "--safety-margin", "1.5"], capsys)
    assert "--memory-budget" in usage_error(["sweep", "--memory-budget", "lots"], capsys)


def test_ctrl_c_mid_sweep_prints_and_keeps_the_finished_rows(tmp_path):
    """A real SIGINT once the first row is on disk: that row is printed and kept; exit 130; 'after 1 of 3'."""
    import signal
    import subprocess
    import sys
    import time

    from labkit.core.clock import Deadline

    from tests.cli.support import ENV

    results = tmp_path / "rows.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", *SWEEP[:5], "--batch-sizes", "8,16,32", "--steps", "400",
                             "--no-find-max", "--no-ceiling", "--no-progress", "--results", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = Deadline(120)
    while not results.exists() and proc.poll() is None and not deadline.expired:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"interrupted (Ctrl-C) after 1 of 3 batch sizes; results so far in {results}" in err
    assert "Traceback" not in err
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["batch_size"] for r in rows] == [8] and out.splitlines()[2].split()[0] == "8"


def test_an_unwritable_results_file_is_a_usage_error_before_any_work(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("")
    assert "--results" in usage_error(SWEEP + ["--results", str(a_file / "rows.jsonl")], capsys)


def test_a_budget_the_finder_refuses_after_the_rows_prints_them_and_names_the_option(tmp_path):
    """--memory-budget below the model's fixed memory: the finished rows are printed and kept, one line in the
    option's words, exit 1."""
    results = tmp_path / "rows.jsonl"
    proc = labkit("sweep", "--dataset", "digits", "--batch-sizes", "8", "--steps", "2", "--memory-budget", "1K",
                  "--no-ceiling", "--results", str(results), "--no-progress")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"stopped by a failure during the largest-batch search, after 1 of 1 batch sizes; "
                                  f"results so far in {results}: --memory-budget=1024 leaves ")
    assert "memory_budget_bytes" not in proc.stderr and proc.stdout.splitlines()[2].split()[0] == "8"
    assert len(results.read_text().splitlines()) == 1
