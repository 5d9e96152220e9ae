"""`labkit profile`: a trace written and summarised, CPU output without GPU noise, usage errors."""
from __future__ import annotations

import json
import os

import pytest

from labkit.cli import main as cli

from tests.cli import support
from tests.cli.support import labkit, usage_error


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


def test_profile_on_cpu_has_no_gpu_error_line_gpu_column_or_repeated_progress(tmp_path, monkeypatch):
    if __import__("torch").cuda.is_available():
        pytest.skip("checks the CPU-only output; on a GPU the GPU column belongs in the table")
    monkeypatch.delitem(support.ENV, "KINETO_LOG_LEVEL", raising=False)   # the kit's own default, not the caller's
    proc = labkit("profile", "--model", "mlp", "--dataset", "synthetic", "--batch-size", "8", "--wait", "0",
                  "--warmup", "1", "--active", "2", "--run-dir", str(tmp_path), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "gpuGetDeviceCount" not in proc.stderr and "ERROR" not in proc.stderr
    assert "USDT:" not in proc.stderr and "profiler_start" not in proc.stderr and "profiler_stop" not in proc.stderr
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
    assert err.startswith("error: --run-dir /proc/no-such-dir cannot be created (")
    assert len(err.strip().splitlines()) == 1
    file_path = tmp_path / "a_file"
    file_path.write_text("")
    assert "--run-dir" in usage_error(["profile", "--run-dir", str(file_path)], capsys)
    if not __import__("torch").cuda.is_available():
        assert "no CUDA GPU" in usage_error(["profile", "--device", "cuda"], capsys)


def test_profile_stops_training_once_every_trace_is_written(tmp_path, capsys):
    """--steps 200 with a 10-step schedule: training stops after the last trace (the bar shows 10, not 200)."""
    from labkit.core.models import MLP
    from labkit.profile.profiler import profile_training

    seen = []

    def batches():
        import torch
        for step in range(200):
            seen.append(step)
            yield torch.zeros(4, 8), torch.zeros(4, dtype=torch.long)

    summary = profile_training(MLP(2, 8, 4), batches(), run_dir=tmp_path, wait=1, warmup=1, active=3, repeat=2,
                               steps=200)
    assert len(summary.trace_files) == 2 and len(seen) == 10


def test_profile_on_a_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path):
    from tests.fault_support import fill, tiny_tmpfs

    with tiny_tmpfs(tmp_path) as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root); the ENOSPC path is covered in tests/core")
        run_dir = mount / "prof"
        run_dir.mkdir()
        fill(mount)
        proc = labkit("profile", "--model", "mlp", "--dataset", "digits", "--batch-size", "8", "--run-dir",
                      str(run_dir), "--no-progress")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        trace = run_dir / "trace_cycle0.pt.trace.json"
        assert f"after 0 of 1 profiled cycles (traces) (cannot write {trace}: the disk is full (ENOSPC)" \
            in proc.stderr and list(run_dir.iterdir()) == []


def test_a_usage_error_leaves_no_empty_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "new" / "prof"
    assert "fewer than the schedule needs" in usage_error(["profile", "--steps", "2", "--run-dir", str(run_dir)],
                                                          capsys)
    assert not (tmp_path / "new").exists()


def test_a_real_sigterm_before_the_first_trace_leaves_no_empty_trace_folder(tmp_path):
    """SIGTERM while the schedule still waits: exit 143, '0 of 1', and the default trace folder is gone again."""
    import signal
    import subprocess
    import sys
    import time

    from tests.cli.support import ENV

    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "profile", "--dataset", "synthetic", "--model", "mlp",
                             "--wait", "1000000", "--active", "1", "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**ENV, "LABKIT_RUN_DIR": str(runs)})
    try:
        deadline = time.monotonic() + 180
        while not list(runs.glob("profile/mlp-b32-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err.strip().endswith("terminated (SIGTERM) after 0 of 1 profiled cycles (traces)")
    assert not runs.exists()
