import pytest

from labkit.core.rundirs import check_writable_dir


def test_creates_nested_dir(tmp_path):
    path = check_writable_dir(tmp_path / "runs" / "exp")
    assert path.is_dir()


def test_unwritable_dir_is_clear(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="is not a writable directory"):
        check_writable_dir(blocker / "sub")


def test_run_root_is_the_checkout_runs_folder_or_the_env_var(tmp_path, monkeypatch):
    from pathlib import Path

    import labkit
    from labkit.core.rundirs import run_path, run_root

    monkeypatch.delenv("LABKIT_RUN_DIR", raising=False)
    assert run_root() == Path(labkit.__file__).resolve().parent.parent / "runs"
    monkeypatch.setenv("LABKIT_RUN_DIR", str(tmp_path))
    assert run_path("profile", "x") == tmp_path / "profile" / "x"
