"""Progress bars show in a terminal or a kernel, never as repeated lines in a log."""
import io
import sys

from labkit.core.progress import progress_bar, progress_enabled


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_when_stderr_is_a_pipe(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    assert not progress_enabled()
    assert sum(progress_bar(range(50), desc="x")) == sum(range(50))
    assert log.getvalue() == ""


def test_bar_in_a_terminal_and_never_when_refused(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert progress_enabled() and not progress_enabled(False)
    list(progress_bar(range(3), desc="steps"))
    assert "steps" in sys.stderr.getvalue()


def test_bar_in_a_jupyter_kernel(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_enabled()
