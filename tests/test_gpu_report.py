"""`make gpu-check`'s report writer (scripts/gpu_report.py) and its script: JUnit parsing on a real pytest run,
every section rendered from the recorded H100 fixtures, missing steps reported, the no-GPU dry run, a step's ledger
result, the committed ledger, and a slot that crashes or is started twice."""
import importlib.util
import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))   # developer tooling lives in scripts/
from gpu_report import (Outcome, ReportInputs, junit_file_of, ledger_result, load_inputs, output_name, parse_junit,
                        render_report)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "gpu_check"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse_junit_from_a_real_pytest_run(tmp_path):
    (tmp_path / "test_mini.py").write_text(textwrap.dedent("""
        import pytest
        def test_ok(): pass
        def test_bad(): assert 1 == 2, "one is not two"
        @pytest.mark.skip(reason="TensorFlow is not installed")
        def test_tf(): pass
    """))
    xml = tmp_path / "out.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_mini.py"),
                    f"--junitxml={xml}"], cwd=tmp_path, capture_output=True, timeout=120)
    (outcome,) = parse_junit(xml)
    assert outcome.name.endswith("test_mini.py")
    assert (outcome.passed, outcome.failed, outcome.errors, outcome.skipped) == (1, 1, 0, 1)
    assert outcome.status == "FAIL" and outcome.first_failure.startswith("test_bad:")
    assert any("TensorFlow is not installed" in r for r in outcome.skip_reasons)


def test_file_names_for_tests_and_notebooks():
    case = lambda **attrs: ET.Element("testcase", attrs)  # noqa: E731
    assert junit_file_of(case(classname="tests.test_ladder", name="x")) == "tests/test_ladder.py"
    assert junit_file_of(case(classname="tests.training.test_loop.TestTiming", name="x")) == \
        "tests/training/test_loop.py"
    assert junit_file_of(case(classname="notebooks.10_tuning_ladder.ipynb", name="Cell 6")) == \
        "notebooks/10_tuning_ladder.ipynb"
    assert junit_file_of(case(file="tests/test_x.py", classname="whatever")) == "tests/test_x.py"
    assert Outcome("a", skipped=3).status == "skipped" and Outcome("a", passed=1, skipped=2).status == "pass"


def test_report_from_the_recorded_h100_fixtures():
    versions = json.loads((FIXTURES / "versions.json").read_text())
    text = render_report(load_inputs(FIXTURES, versions, dry_run=True))
    assert text.startswith("# GPU check report") and "DRY RUN from recorded fixtures, not a live GPU run" in text
    assert "| driver | 580.159.04 |" in text and "| tensorflow | absent" in text
    assert "| `notebooks/10_tuning_ladder.ipynb` | FAIL | 7 | 1 |" in text
    assert "| `tests/test_ladder.py` | FAIL | 0 | 2 | 5 |" in text          # recorded before tests had folders
    assert "| resnet18 | 128 | ? | 8.50 | 10.86 | +27.8% | NO | not measured | - |" in text   # +27.8%: issue 13
    assert "Largest error 54.1% (target within 5%: NOT met)" in text              # small-batch fp32: cuDNN workspace
    assert "| small_cnn | 64 | fp32 | sgd | 39 | not measured | 85 | 164 | -54.1% |" in text
    assert "Ceiling: 59815.2 samples/s" in text and "target 90%: NOT met" in text     # rung 1 was at chance
    assert text.count("\n| ") > 30


def test_a_step_that_produced_nothing_is_said_not_hidden():
    text = render_report(ReportInputs({"device": "X"}, [], []))
    assert "| torch | unknown |" in text and text.count("Nothing was run.") == 2
    for step in ("loop_overhead.py", "memory_check.py", "labkit ladder"):
        assert f"Not available: `{'benchmarks/' if step.endswith('.py') else 'python -m '}{step}" in text


def test_overhead_and_memory_targets_are_judged():
    over = {"device": "d", "rows": [{"model": "m", "batch_size": 8, "bare_step_s": 0.01, "instrumented_step_s": 0.0101,
                                     "ratio": 1.01, "step_timing_ratio": 1.025, "sync_every_step_ratio": 1.3}]}
    mem = {"device": "d", "max_abs_error_pct": 7.5, "rows": []}
    text = render_report(ReportInputs({}, [], [], loop_overhead=over, memory=mem))
    assert "| 10.10 | +1.0% | yes | +2.5% | NO | +30.0% |" in text and "Largest error 7.5% (target within 5%: NOT met)" in text


def test_the_floor_of_one_event_is_shown_beside_the_overhead():
    row = {"model": "small_cnn", "batch_size": 256, "bare_step_s": 0.00194, "instrumented_step_s": 0.0022,
           "ratio": 1.134, "step_timing_ratio": 1.053, "event_record_read_s": 12e-6,
           "overhead_claim": "bounded: +5.3% is within 2% of the floor"}
    cpu = dict(row, event_record_read_s=None, event_floor_reason="NOT CHECKED: no CUDA device here")
    text = render_report(ReportInputs({}, [], [], loop_overhead={"device": "d", "rows": [row, cpu]}))
    assert "| 12.0 | bounded: +5.3% is within 2% of the floor |" in text
    assert "| not measured | NOT CHECKED: no CUDA device here |" in text


def test_a_steps_files_become_its_ledger_result(tmp_path):
    (tmp_path / output_name("tests/core/test_step.py")).write_text(
        '<testsuite><testcase classname="tests.core.test_step" name="a"/>'
        '<testcase classname="tests.core.test_step" name="b"><failure message="boom"/></testcase></testsuite>')
    assert ledger_result("tests/core/test_step.py", "failed (exit 1)", tmp_path)[0] == "FAIL (1 of 2 tests): b: boom"
    (tmp_path / "memory.json").write_text(json.dumps({"max_abs_error_pct": 4.5, "rows": [{}] * 32}))
    assert ledger_result("benchmarks/memory_check.py", "ok", tmp_path) == \
        ("ran", "memory model: largest error 4.5% over 32 rows")
    over = {"rows": [{"model": "small_cnn", "batch_size": 256, "bare_step_s": 0.00194, "ratio": 1.134,
                      "step_timing_ratio": 1.053}]}                      # the H200's figures of 27 November
    (tmp_path / "loop_overhead.json").write_text(json.dumps(over))
    result, figures = ledger_result("benchmarks/loop_overhead.py", "ok", tmp_path)
    assert result == "ran; 2% target NOT met on small_cnn" and "small_cnn b256 (1.94 ms): whole-step +5.3%" in figures
    assert ledger_result("notebooks/10_tuning_ladder.ipynb", "stopped at its limit of 300 s", tmp_path) == \
        ("not finished (stopped at its limit of 300 s)", "")


def test_without_a_gpu_the_script_dry_runs_and_exits_0(tmp_path, monkeypatch, capsys):
    script = load_script()
    monkeypatch.setattr(script, "cuda_present", lambda: False)
    out = tmp_path / "report.md"
    assert script.main(["--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "no CUDA GPU on this machine" in said and "dry run ok" in said
    assert "DRY RUN" in out.read_text() and "planned against a deadline of 560 s" in said


def test_committed_report_is_a_ledger_with_a_row_per_step():
    """docs/gpu-report.md holds one row per notebook, GPU test file and benchmark, and reads back as written."""
    sys.path.insert(0, str(REPO / "scripts"))
    from gpu_ledger import all_steps, parse_ledger, render_table

    text = (REPO / "docs" / "gpu-report.md").read_text()
    rows = parse_ledger(text)
    tracked = set(subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True).stdout.split())
    missing = {s for s in all_steps(REPO) if s in tracked} - {r.step for r in rows}   # a notebook not yet committed
    # gets its row when the ledger is rendered again (the plan reads the folder and counts it already)
    assert not missing, f"no ledger row for {sorted(missing)}: run `.venv/bin/python scripts/gpu_check.py --render-ledger`"
    assert "\n".join(render_table(rows)) in text                      # the table round-trips
    for section in ("## Ledger", "## Older than the code they checked", "## Never run on a GPU",
                    "## Full mode against the 180 s budget", "## Next slot's plan", "## Last slot", "## Notes"):
        assert section in text


def _live(script, monkeypatch, tmp_path):
    monkeypatch.setattr(script, "cuda_present", lambda: True)
    monkeypatch.setenv("LABKIT_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(script, "machine_versions", lambda: json.loads((script.FIXTURES / "versions.json").read_text()))
    plan = ([script.Choice("notebooks/00_start_here.ipynb", "missing", 16.0, True)], "Plan: 1 step(s)")
    monkeypatch.setattr(script, "the_plan", lambda *a: plan)      # the choice itself: tests/test_gpu_ledger.py
    ledger = tmp_path / "ledger.md"
    ledger.write_text((REPO / "docs" / "gpu-report.md").read_text())
    return ["--ledger", str(ledger), "--commit", "abc1234"]


def test_a_live_run_starts_from_an_empty_work_folder(tmp_path, monkeypatch):
    """A step that fails must read 'not available' in the report, not show an older run's file."""
    script = load_script()
    args = _live(script, monkeypatch, tmp_path)
    stale = tmp_path / "gpu-check" / "ladder.json"
    stale.parent.mkdir()
    stale.write_text("{}")
    seen = []
    monkeypatch.setattr(script, "run_slot", lambda chosen, **kw: seen.append((stale.exists(), len(chosen))) or [])
    assert script.main(args) == 0
    assert seen == [(False, 1)]
    assert (tmp_path / "gpu-check.previous" / "ladder.json").is_file()      # the older run is kept aside, not lost


def test_a_check_that_crashes_still_writes_its_report_and_fails(tmp_path, monkeypatch):
    """Whatever stops the run (here an exception inside it), the report is written with the reason, and exit is 1."""
    script = load_script()
    args = _live(script, monkeypatch, tmp_path)

    def crash(*args, **kwargs):
        raise RuntimeError("pip could not install the carried wheels")

    monkeypatch.setattr(script, "run_slot", crash)
    assert script.main(args) == 1
    assert "the slot stopped early: RuntimeError: pip could not install the carried wheels" in \
        (tmp_path / "gpu-check" / "report.md").read_text()


def test_a_second_start_in_one_slot_is_refused_and_touches_nothing(tmp_path, monkeypatch, capsys):
    """The fallback that re-ran the check on 27 November deleted the first run's evidence: a re-run is refused."""
    script = load_script()
    args = _live(script, monkeypatch, tmp_path)
    runs = []
    monkeypatch.setattr(script, "run_slot", lambda chosen, **kw: runs.append(1) or [])
    assert script.main(args) == 0 and runs == [1]
    (tmp_path / "gpu-check" / "evidence.txt").write_text("first slot")
    before = (tmp_path / "ledger.md").read_text()
    assert script.main(args) == 2 and runs == [1]
    assert "never runs twice in one slot" in capsys.readouterr().err
    assert (tmp_path / "gpu-check" / "evidence.txt").is_file() and (tmp_path / "ledger.md").read_text() == before
    assert script.main([*args, "--new-slot"]) == 0 and runs == [1, 1]


def test_the_small_cnns_claim_is_bounded_by_one_events_cost():
    """loop_overhead's whole-step claim: met under 2%; where missed, bounded by the measured cost of one event
    record + read (rival: 'the excess is the event' -- rejected once the overhead passes floor + 2%)."""
    spec = importlib.util.spec_from_file_location("loop_overhead", REPO / "benchmarks" / "loop_overhead.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import torch

    event_s, why = bench.event_cost_s(torch.device("cpu"))
    assert event_s is None and why.startswith("NOT CHECKED: no CUDA device")
    small_cnn = {"bare_step_s": 1.94e-3, "step_timing_ratio": 1.053}            # the H200's small CNN, 27 November
    assert bench.overhead_claim(small_cnn, None, why) == why
    assert bench.overhead_claim(small_cnn, 80e-6, "measured").startswith("bounded: +5.3% is within 2% of the floor "
                                                                          "of one event record+read (4.1%)")
    assert bench.overhead_claim(small_cnn, 10e-6, "measured").startswith("NOT met: +5.3% exceeds the event floor 0.5%")
    assert bench.overhead_claim(dict(small_cnn, step_timing_ratio=1.013), 10e-6, "m").startswith("met: +1.3% < 2%")
