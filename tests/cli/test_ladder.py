"""`labkit ladder`: arguments checked before the run, commas for lists, JSON and Markdown written."""
import json

import pytest
import torch

from labkit.cli import main as cli

from tests.cli.support import labkit, usage_error
from tests.ladder.fakes import MEASURED


def cli_error(argv, capsys, monkeypatch) -> tuple[int, str]:
    """Run `python -m labkit ARGV` in-process with the ladder itself forbidden; (exit code, stderr)."""
    import labkit.ladder.climb

    monkeypatch.setattr(labkit.ladder.climb, "run_ladder",
                        lambda *a, **k: pytest.fail("the ladder ran before the check"))
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def test_cli_out_is_checked_before_the_run(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "ladder.json"
    a_file.write_text("{}")
    assert cli_error(["ladder", "--out", str(a_file)], capsys, monkeypatch) == (
        2, f"error: --out {a_file} is a file, not a directory; give a directory for ladder.json and ladder.md, "
           "e.g. --out runs/ladder\n")
    bad = a_file / "sub"
    assert cli_error(["ladder", "--out", str(bad)], capsys, monkeypatch) == (
        2, f"error: --out {bad} cannot be created ({a_file} is a file); pass an --out you can write to, e.g. "
           "--out runs/ladder\n")


def test_cli_ddp_world_size_is_checked_before_the_run(capsys, monkeypatch, tmp_path):
    import labkit.comm.backend
    import labkit.core.device

    monkeypatch.setattr(labkit.comm.backend, "cpu_count", lambda: 2)
    assert cli_error(["ladder", "--device", "cpu", "--ddp-world-size", "100000", "--out", str(tmp_path)],
                     capsys, monkeypatch) == (
        2, "error: --ddp-world-size must be an integer between 1 and 8, got 100000; gloo runs at most 4 processes "
           "per CPU core x 2 cores here, and every rank is a full Python process with torch: use fewer ranks, or "
           "GPUs with NCCL\n")
    monkeypatch.setattr(labkit.core.device, "get_device", lambda device=None: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, err = cli_error(["ladder", "--ddp-world-size", "2", "--out", str(tmp_path)], capsys, monkeypatch)
    assert (code, err) == (2, "error: --ddp-world-size must be an integer between 1 and 1, got 2; NCCL runs one "
                              "process per GPU and this machine has 1\n")


def test_cli_batch_sizes_take_commas_like_sweep(tmp_path, capsys, monkeypatch):
    code, err = cli_error(["ladder", "--batch-sizes", "16 32"], capsys, monkeypatch)
    assert code == 2 and err.endswith("\nlabkit ladder: error: argument --batch-sizes: give the numbers separated by "
                                      "commas, e.g. 16,32; got '16 32'\n")
    code, err = cli_error(["ladder", "--batch-sizes", "16;32 64"], capsys, monkeypatch)
    assert code == 2 and err.endswith("argument --batch-sizes: give the numbers separated by commas, e.g. 16,32,64; "
                                      "got '16;32 64'\n")
    code, err = cli_error(["ladder", "--batch-sizes", "16 x"], capsys, monkeypatch)  # a bad number: its own message
    assert code == 2 and err.endswith("argument --batch-sizes: expected a positive integer (1, 2, 3, ...), "
                                      "got '16 x'\n")
    from labkit.cli.ladder import config_from_args

    args = cli.build_parser().parse_args(["ladder", "--model", "mlp", "--batch-sizes", "4,8", "--skip", "compile",
                                          "ddp", "--budget-epochs", "2", "--out", str(tmp_path)])
    cfg = config_from_args(args)   # checks --out (creating it): tmp_path, not the repository's runs/ladder
    assert (cfg.model, cfg.batch_candidates, cfg.skip, cfg.budget_epochs) == ("mlp", (4, 8), ("compile", "ddp"), 2)


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    code = cli.main(["ladder", "--out", str(tmp_path), "--model", "mlp", "--dataset", "digits", "--train-limit", "32",
                     "--budget-epochs", "1", "--batch-sizes", "4,8", "--device", "cpu", "--no-progress", "--skip",
                     "input_pipeline", "device_data", "no_sync", "mixed_precision", "channels_last", "compile", "ddp"])
    assert code == 0
    doc = json.loads((tmp_path / "ladder.json").read_text())
    assert doc["rows"][1]["status"] in MEASURED and doc["dataset"] == "digits"
    md = (tmp_path / "ladder.md").read_text()
    assert md.startswith("Device:") and "| to target (s) |" in md and "\nTarget: " in md
    assert "\nFirst to the target: " in md
    assert "wrote" in capsys.readouterr().out


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
    from labkit.ladder.first_to_target import TargetPlan

    block, rows = data["to_target"], {r["rung"]: r for r in data["rows"]}     # stdout held the JSON and nothing else
    assert block["target_accuracy"] == TargetPlan.for_mode().target and block["target_source"]
    assert {r["to_target_status"] for r in rows.values()} <= {"reached", "missed", "not timed"}
    assert rows[0]["to_target_status"] in ("reached", "missed") and len(rows[0]["to_target_seconds"]) == 3
    for row in rows.values():                # a time only where the rung reached the target, never for a miss
        assert (row["time_to_target_s"] is not None) == (row["to_target_status"] == "reached")
    reached = {r: row["time_to_target_s"] for r, row in rows.items() if row["to_target_status"] == "reached"}
    assert block["first_rung"] == (min(reached, key=reached.get) if reached else None)


def test_ladder_usage_errors_exit_2(tmp_path, capsys):
    proc = labkit("ladder", "--skip", "warp_drive")
    assert proc.returncode == 2 and "--skip" in proc.stderr
    err = usage_error(["ladder", "--budget-epochs", "0", "--out", str(tmp_path)], capsys)
    assert "--budget-epochs must be" in err and "budget_epochs" not in err   # the option typed, not the parameter


def test_a_usage_error_leaves_no_empty_out_folder(tmp_path, capsys, monkeypatch):
    out = tmp_path / "new" / "ladder"
    assert cli_error(["ladder", "--out", str(out), "--budget-epochs", "0"], capsys, monkeypatch)[0] == 2
    assert not (tmp_path / "new").exists()


def test_a_bad_run_dir_is_blamed_on_the_variable_not_on_out(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "f"
    a_file.write_text("")
    monkeypatch.setenv("LABKIT_RUN_DIR", str(a_file))
    code, err = cli_error(["ladder"], capsys, monkeypatch)
    assert code == 2 and err.startswith(f"error: LABKIT_RUN_DIR={a_file} is a file") and "--out" not in err


def test_sigterm_mid_ladder_keeps_and_prints_the_finished_rungs(tmp_path, capsys, monkeypatch):
    """A real SIGTERM after two rungs: both are on disk and printed; exit 143; the message says 2 of N."""
    import os
    import signal

    import labkit.ladder.climb
    from labkit.ladder.report import LadderRow
    from labkit.ladder.rungs import RUNG_KEYS

    def two_rungs_then_sigterm(config, on_rung=None, **kwargs):
        for rung in range(2):
            on_rung(LadderRow(rung, RUNG_KEYS[rung], f"rung {rung}", "", "", "", "faster", "", True, None,
                              samples_per_s=100.0 * (rung + 1)))
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000_000):
            pass
        pytest.fail("SIGTERM did not stop the ladder")

    monkeypatch.setattr(labkit.ladder.climb, "run_ladder", two_rungs_then_sigterm)
    assert cli.main(["ladder", "--out", str(tmp_path), "--no-progress"]) == 143
    captured = capsys.readouterr()
    assert "rung 1" in captured.out and "200.0" in captured.out
    assert f"terminated (SIGTERM) after 2 of {len(RUNG_KEYS)} rungs; results so far in {tmp_path / 'ladder.jsonl'}" \
        in captured.err
    rows = [json.loads(line) for line in (tmp_path / "ladder.jsonl").read_text().splitlines()]
    assert [r["rung"] for r in rows] == [0, 1] and not (tmp_path / "ladder.json").exists()


def test_sigterm_while_the_ceiling_runs_says_so_and_names_an_earlier_report(tmp_path, capsys, monkeypatch):
    """Every rung in, SIGTERM during the ceiling: the message says so, and an earlier run's ladder.json/md left
    in --out is named as such (it must not pass for this run's)."""
    import os
    import signal

    import labkit.ladder.climb
    from labkit.ladder.report import LadderRow
    from labkit.ladder.rungs import RUNG_KEYS

    def every_rung_then_sigterm(config, on_rung=None, **kwargs):
        for rung, key in enumerate(RUNG_KEYS):
            on_rung(LadderRow(rung, key, f"rung {rung}", "", "", "", "faster", "", True, None, samples_per_s=1.0))
        os.kill(os.getpid(), signal.SIGTERM)        # the ceiling would run now
        for _ in range(10_000_000):
            pass
        pytest.fail("SIGTERM did not stop the ladder")

    (tmp_path / "ladder.json").write_text('{"earlier": true}')
    (tmp_path / "ladder.md").write_text("earlier")
    monkeypatch.setattr(labkit.ladder.climb, "run_ladder", every_rung_then_sigterm)
    assert cli.main(["ladder", "--out", str(tmp_path), "--no-progress"]) == 143
    err = capsys.readouterr().err
    n = len(RUNG_KEYS)
    assert f"terminated (SIGTERM) during the hardware ceiling, after {n} of {n} rungs; results so far in " \
        f"{tmp_path / 'ladder.jsonl'}; ladder.json and ladder.md there are from an earlier run" in err
    assert json.loads((tmp_path / "ladder.json").read_text()) == {"earlier": True}


def test_a_full_disk_at_save_is_one_line_and_leaves_no_half_file(tmp_path, monkeypatch):
    from labkit.core import results
    from labkit.ladder.report import LadderResult
    from tests.fault_support import fill, raise_enospc, tiny_tmpfs

    result = LadderResult([], "cpu", "fast", "mlp", "digits", 32, {}, [])
    with tiny_tmpfs(tmp_path) as mount:
        out = (mount or tmp_path) / "ladder"
        out.mkdir()
        if mount is None:                       # no mount allowed: the same errno from a stand-in write
            monkeypatch.setattr(results.os, "fsync", raise_enospc)
        else:
            fill(mount)
        with pytest.raises(results.WriteError, match=r"ladder.json: the disk is full \(ENOSPC\)"):
            result.save(out)
        assert not list(out.iterdir())


def _plan_passed(argv, monkeypatch, tmp_path):
    """The to_target plan `labkit ladder ARGV` hands run_ladder (the ladder itself replaced by a stub)."""
    import labkit.ladder.climb
    from labkit.ladder.report import LadderResult

    seen = {}

    def stub(config, on_rung=None, to_target=None, on_phase=None, **kwargs):
        seen["plan"] = to_target
        on_phase("the time to the target")
        return LadderResult([], "cpu", "fast", "mlp", "digits", 32, {}, [])

    monkeypatch.setattr(labkit.ladder.climb, "run_ladder", stub)
    assert cli.main(["ladder", "--out", str(tmp_path), "--no-progress", "--json", *argv]) == 0
    return seen["plan"]


def test_to_target_is_on_by_default_and_target_and_no_to_target_are_honoured(tmp_path, capsys, monkeypatch):
    from labkit.ladder.first_to_target import TargetPlan

    assert _plan_passed([], monkeypatch, tmp_path) == TargetPlan.for_mode()
    plan = _plan_passed(["--target", "0.9"], monkeypatch, tmp_path)
    assert (plan.target, plan.source) == (0.9, "--target, as given")
    assert _plan_passed(["--no-to-target"], monkeypatch, tmp_path) is None
    capsys.readouterr()


def test_a_bad_target_is_a_usage_error_before_the_run(tmp_path, capsys, monkeypatch):
    code, err = cli_error(["ladder", "--target", "90", "--out", str(tmp_path)], capsys, monkeypatch)
    assert code == 2 and err.endswith("argument --target: expected an accuracy between 0 and 1 (a fraction: 0.9 "
                                      "for 90%), got '90'\n")
    code, err = cli_error(["ladder", "--target", "x", "--out", str(tmp_path)], capsys, monkeypatch)
    assert code == 2 and err.endswith("argument --target: expected an accuracy such as 0.9, got 'x'\n")
    assert cli_error(["ladder", "--target", "0.9", "--no-to-target", "--out", str(tmp_path)], capsys, monkeypatch) == (
        2, "error: --target needs the rungs timed to it: drop --no-to-target, or drop --target\n")


def test_sigterm_while_the_rungs_are_timed_to_the_target_says_so(tmp_path, capsys, monkeypatch):
    import os
    import signal

    import labkit.ladder.climb
    from labkit.ladder.report import LadderRow
    from labkit.ladder.rungs import RUNG_KEYS

    def every_rung_then_sigterm_to_target(config, on_rung=None, on_phase=None, **kwargs):
        for rung, key in enumerate(RUNG_KEYS):
            on_rung(LadderRow(rung, key, f"rung {rung}", "", "", "", "faster", "", True, None, samples_per_s=1.0))
        on_phase("the hardware ceiling")
        on_phase("the time to the target")
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000_000):
            pass
        pytest.fail("SIGTERM did not stop the ladder")

    monkeypatch.setattr(labkit.ladder.climb, "run_ladder", every_rung_then_sigterm_to_target)
    assert cli.main(["ladder", "--out", str(tmp_path), "--no-progress"]) == 143
    n = len(RUNG_KEYS)
    assert f"terminated (SIGTERM) during the time to the target, after {n} of {n} rungs" in capsys.readouterr().err
