"""`labkit diagnose`: help with examples, a report and exit 1 on a hang (the run itself: tests/parallel)."""
from __future__ import annotations

import pytest

from labkit.cli import main as cli
from labkit.parallel.debug import diagnose as diag
from labkit.parallel.debug.flight_recorder import Divergence


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        cli.main(["diagnose", "--help"])
    assert "labkit diagnose --world-size 3" in capsys.readouterr().out


@pytest.mark.parametrize("ok, drifted, code", [(False, (), 1), (True, (1,), 1), (True, (), 0)])
def test_prints_the_report_and_exits_1_on_a_hang_or_drift(monkeypatch, capsys, ok, drifted, code):
    seen = {}

    def fake(target, world_size, **kw):
        seen.update(target=target, world_size=world_size, **kw)
        return diag.DiagnoseReport(target, world_size, ok, "" if ok else "rank 0 failed", Divergence(
            None, (), "agree", None), {}, {}, drifted, 1.0)

    monkeypatch.setattr(diag, "run_diagnosed", fake)
    assert cli.main(["diagnose", "--world-size", "3", "--pg-timeout", "4", "m:f"]) == code
    assert seen == {"target": "m:f", "world_size": 3, "pg_timeout_s": 4.0, "timeout_s": 120.0, "detail": False}
    assert "m:f on 3 ranks" in capsys.readouterr().out


def test_a_bad_world_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as err:
        cli.main(["diagnose", "--world-size", "0", "m:f"])
    assert err.value.code == 2
