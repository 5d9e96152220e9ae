import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.core.procs import run_in_fresh_process

REPO = Path(__file__).resolve().parents[2]


def test_result_comes_back_and_torch_stays_out():
    out = run_in_fresh_process("labkit.core.procs:_probe_modules", {})
    assert out["torch"] is False and out["child_wall_s"] > 0


def test_child_value_error_is_raised_here(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RuntimeError, match="not a writable directory"):   # PermissionError is not mapped
        run_in_fresh_process("labkit.core.rundirs:check_writable_dir", {"run_dir": str(blocker / "x")})
    with pytest.raises(TypeError):
        run_in_fresh_process("labkit.core.rundirs:check_writable_dir", {"no_such_arg": 1})


def test_bad_target_and_timeout():
    with pytest.raises(ValueError, match="labkit.module:function"):
        run_in_fresh_process("os:getcwd")
    with pytest.raises(TimeoutError, match="did not finish"):
        run_in_fresh_process("labkit.core.timing:time_fn", {"fn": None}, timeout_s=0.01)


def test_tensorflow_missing_reason_says_how_to_install(monkeypatch):
    import importlib.util

    from labkit.core.procs import tensorflow_missing_reason

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    assert "pip install tensorflow-cpu==2.21" in tensorflow_missing_reason()


# A sitecustomize that hides TensorFlow from this process and every child it starts, as on a box without it.
HIDE_TENSORFLOW = "import sys\nsys.modules['tensorflow'] = None   # 'import tensorflow' now raises ImportError\n"


def without_tensorflow(tmp_path, code_or_args: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` with TensorFlow hidden (a sitecustomize on PYTHONPATH) from the repository root."""
    shim = tmp_path / "hide_tf"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(HIDE_TENSORFLOW)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, env=env,
                          timeout=timeout_s, cwd=REPO)


def test_tensorflow_tests_skip_with_one_reason_where_tensorflow_is_absent(tmp_path):
    """`make test` on a GPU box without TF: the TF tests skip, each with the install hint, and the run is green."""
    tf_tests = ["tests/tf/test_profiler.py", "tests/tf/test_distribute.py",
                "tests/tf/test_threads.py::test_tf_sweep_in_children",
                "tests/tf/test_precision.py::test_keras_mixed_bfloat16_policy_child"]
    proc = without_tensorflow(tmp_path, ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tf_tests])
    assert proc.returncode == 0, proc.stdout[-3000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) >= 4, proc.stdout[-3000:]
    assert all("TensorFlow is not installed in this environment" in line for line in skipped), skipped
    assert " failed" not in proc.stdout and " error" not in proc.stdout


def test_notebook_helper_marks_tensorflow_lessons_not_checked(tmp_path):
    code = ("from labkit.core.lessons import LessonLog\n"
            "from labkit.core.procs import tensorflow_lessons_can_run\n"
            "log = LessonLog('demo')\n"
            "print('ran' if tensorflow_lessons_can_run(log, 'cache before shuffle', 'prefetch overlaps') else 'skipped')\n"
            "log.tally()\n")
    proc = without_tensorflow(tmp_path, ["-c", code], timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("NOT CHECKED: cache before shuffle (TensorFlow is not installed in this environment")
    assert lines[1].startswith("NOT CHECKED: prefetch overlaps (") and "skipped" in lines
    assert "0 of 2 lessons checked" in proc.stdout


def test_notebook_helper_runs_tensorflow_lessons_where_tensorflow_is_present():
    from labkit.core.procs import tensorflow_lessons_can_run, tensorflow_missing_reason
    from labkit.core.lessons import LessonLog

    log = LessonLog("demo")
    assert tensorflow_lessons_can_run(log, "a claim") is (tensorflow_missing_reason() is None)
    assert log.not_checked_reasons == ({} if tensorflow_missing_reason() is None
                                       else {"a claim": tensorflow_missing_reason()})


def test_parse_target_is_the_one_reader_of_module_function_strings():
    from labkit.core.procs import parse_target

    assert parse_target("labkit.comm.demos:all_reduce_sum") == ("labkit.comm.demos", "all_reduce_sum")
    assert parse_target("labkit.core.timing:time_fn", package="labkit") == ("labkit.core.timing", "time_fn")
    for bad in ("labkit.comm.demos", ":f", "m:", ""):
        with pytest.raises(ValueError, match=r"must read 'package.module:function'"):
            parse_target(bad)
    with pytest.raises(ValueError, match=r"^target must read 'labkit.module:function', got 'os:getcwd'$"):
        parse_target("os:getcwd", "target", package="labkit")


def test_tensorflow_children_grow_gpu_memory_instead_of_reserving_it(monkeypatch):
    """On a GPU box a TF child must not reserve most of the card under the kernel's PyTorch tensors."""
    import subprocess

    from labkit.core import procs

    seen = {}

    def fake_run(cmd, **kw):
        seen.update(kw["env"])
        raise subprocess.TimeoutExpired(cmd, 1)
    monkeypatch.setattr(procs.subprocess, "run", fake_run)
    with pytest.raises(Exception):
        procs.run_in_fresh_process("labkit.tf.distribute:tf_device_label", timeout_s=1)
    assert seen["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" and seen["TF_CPP_MIN_LOG_LEVEL"] == "2"
