import pytest

from labkit.rundirs import check_writable_dir


def test_creates_nested_dir(tmp_path):
    path = check_writable_dir(tmp_path / "runs" / "exp")
    assert path.is_dir()


def test_unwritable_dir_is_clear(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="is not a writable directory"):
        check_writable_dir(blocker / "sub")
