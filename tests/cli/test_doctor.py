import json
import subprocess
import sys

from labkit.cli import doctor


def test_report_has_every_piece(monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    report = doctor.collect()
    assert report.ok and report.cpu_cores >= 1 and report.ram_bytes > 0
    assert {"torch", "torchvision", "tensorflow-cpu", "jupyterlab", "ipywidgets"} <= set(report.packages)
    assert report.mode in ("fast", "full") and report.dataset in ("cifar10", "digits")
    text = doctor.format_report(report)
    for word in ("torch", "CPU", "GPUs", "NCCL", "Mode", "Dataset", "CIFAR-10"):
        assert word in text


def test_missing_required_package_gives_one_line_fix(monkeypatch):
    real = doctor.machine.package_version
    monkeypatch.setattr(doctor.machine, "package_version", lambda n: None if n == "torchvision" else real(n))
    report = doctor.collect(check_network=False)
    assert not report.ok and "torchvision" in report.missing_required[0]
    assert "Fix: run `make lab`" in doctor.format_report(report)


def test_tensorflow_is_optional(monkeypatch):
    """A GPU box without TensorFlow passes the doctor (notebook 00's check); the TF lessons say NOT CHECKED."""
    real = doctor.machine.package_version
    monkeypatch.setattr(doctor.machine, "package_version",
                        lambda n: None if n in ("tensorflow-cpu", "tensorflow") else real(n))
    report = doctor.collect(check_network=False)
    assert report.ok and report.packages["tensorflow-cpu"] is None
    assert "tensorflow-cpu         missing (optional: the TensorFlow halves" in doctor.format_report(report)


def run_doctor(*args, env_extra=None):
    import os

    env = {**os.environ, "LABKIT_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "labkit", "doctor", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_doctor_cli_json_and_mode_env():
    proc = run_doctor("--json", env_extra={"LABKIT_MODE": "full"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["mode"] == "full" and "forced" in report["mode_reason"] and report["ok"] is True


def test_doctor_cli_bad_mode_is_usage_error():
    proc = run_doctor(env_extra={"LABKIT_MODE": "turbo"})
    assert proc.returncode == 2 and "LABKIT_MODE must be one of" in proc.stderr


def test_doctor_reports_mpi(monkeypatch):
    monkeypatch.setenv("LABKIT_OFFLINE", "1")
    report = doctor.collect(check_network=False)
    assert "MPI" in report.extras and "MPI" in doctor.format_report(report)


def test_doctor_reports_a_missing_data_folder_and_exits_1(tmp_path):
    """LABKIT_DATA_DIR pointing nowhere used to pass the doctor (exit 0) while load_data failed."""
    from labkit.core.data import REPO_DATA_DIR

    missing = tmp_path / "nope"
    proc = run_doctor("--no-network", env_extra={"LABKIT_DATA_DIR": str(missing)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"Data folder  {missing} — a problem (below)" in proc.stdout.splitlines()
    assert proc.stdout.splitlines()[-3:] == [
        "",
        f"DATA PROBLEM: data folder {missing} (from LABKIT_DATA_DIR={missing}) does not exist",
        f"Fix: point LABKIT_DATA_DIR at a copy of the kit's data folder ({REPO_DATA_DIR}), or unset it to use that "
        "folder",
    ]
    assert "All required pieces are present" not in proc.stdout
    proc = run_doctor("--json", "--no-network", env_extra={"LABKIT_DATA_DIR": str(missing)})
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["ok"] is False
    assert report["data_problem"].startswith(f"data folder {missing} (from LABKIT_DATA_DIR={missing}) does not exist; ")


def test_doctor_reports_a_corrupt_data_file_with_the_copy_to_make(tmp_path, monkeypatch):
    import shutil

    from labkit.core import data

    copy = tmp_path / "data"
    shutil.copytree(data.REPO_DATA_DIR, copy, ignore=shutil.ignore_patterns("cifar-10*"))
    (copy / data.DIGITS_FILE).write_bytes(b"not the digits")
    monkeypatch.setattr(data, "DATA_DIR", copy)
    report = doctor.collect(check_network=False)
    assert not report.ok and report.missing_required == []
    lines = doctor.format_report(report).splitlines()
    assert lines[-2].startswith(f"DATA PROBLEM: {copy / data.DIGITS_FILE} fails its checksum (sha256 ")
    assert lines[-1] == f"Fix: copy the kit's good one over it: `cp {data.REPO_DATA_DIR / data.DIGITS_FILE} " \
                        f"{copy / data.DIGITS_FILE}`"


def test_doctor_names_a_run_folder_the_commands_could_not_write(monkeypatch, tmp_path):
    """A read-only checkout: the doctor says so, rather than `sweep`, `profile` and `ladder` failing later."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr("labkit.core.rundirs.run_root", lambda: blocker / "runs")
    report = doctor.collect(check_network=False)
    assert not report.ok and "run folder" in report.run_dir_problem
    text = doctor.format_report(report)
    assert "RUN FOLDER PROBLEM:" in text and "Fix: export LABKIT_RUN_DIR=" in text
