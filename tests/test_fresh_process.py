import pytest

from labkit.fresh_process import run_in_fresh_process


def test_result_comes_back_and_torch_stays_out():
    out = run_in_fresh_process("labkit.fresh_process:_probe_modules", {})
    assert out["torch"] is False and out["child_wall_s"] > 0


def test_child_value_error_is_raised_here(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RuntimeError, match="not a writable directory"):   # PermissionError is not mapped
        run_in_fresh_process("labkit.rundirs:check_writable_dir", {"run_dir": str(blocker / "x")})
    with pytest.raises(TypeError):
        run_in_fresh_process("labkit.rundirs:check_writable_dir", {"no_such_arg": 1})


def test_bad_target_and_timeout():
    with pytest.raises(ValueError, match="labkit.module:function"):
        run_in_fresh_process("os:getcwd")
    with pytest.raises(TimeoutError, match="did not finish"):
        run_in_fresh_process("labkit.timing:time_fn", {"fn": None}, timeout_s=0.01)


def test_tensorflow_missing_reason_says_how_to_install(monkeypatch):
    import importlib.util

    from labkit.fresh_process import tensorflow_missing_reason

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    assert "pip install tensorflow-cpu==2.21" in tensorflow_missing_reason()
