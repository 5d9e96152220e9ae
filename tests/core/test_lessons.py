"""The lesson log: checks raise with the claim, NOT CHECKED is visible, tallies total across notebooks."""
import json
import subprocess
import sys

import pytest

from labkit.core.lessons import LessonLog, LessonLogError, main, summarize_lesson_log


def test_check_passes_and_counts(capsys):
    log = LessonLog("demo")
    log.check("bigger batches are faster", 2.0 > 1.0)
    with log.lesson("ring sends 2(R-1)/R"):
        assert 1 + 1 == 2
    assert log.tally() == "demo: 2 of 2 lessons checked (0 rejected a named rival, 0 need none)"
    out = capsys.readouterr().out
    assert "2 of 2" in out and "\u2713 bigger batches are faster\n" in out     # a passing check says so


def test_failed_check_names_the_claim():
    log = LessonLog("demo")
    with pytest.raises(AssertionError, match="bigger batches are faster.*1.0 vs 2.0"):
        log.check("bigger batches are faster", False, "1.0 vs 2.0")
    with pytest.raises(AssertionError, match="lesson not shown on this run: a claim \\(x too small"):
        with log.lesson("a claim"):
            assert False, "x too small"
    assert log.total == 0


def test_not_checked_is_printed_and_tallied(capsys):
    log = LessonLog("06b")
    log.check("a", True)
    log.not_checked("MPI beats gloo", "mpiexec not found: pip install -e '.[mpi]'")
    out = capsys.readouterr().out
    assert "NOT CHECKED: MPI beats gloo (mpiexec not found" in out
    assert log.tally().startswith("06b: 1 of 2 lessons checked (0 rejected a named rival, 0 need none); not checked: MPI beats gloo")
    with pytest.raises(ValueError, match="reason"):
        log.not_checked("b", "  ")


def test_tally_appends_to_log_file_and_summary_totals(tmp_path, monkeypatch):
    path = tmp_path / "lessons.jsonl"
    monkeypatch.setenv("LABKIT_LESSON_LOG", str(path))
    first = LessonLog("01")
    first.check("x", True)
    first.tally()
    second = LessonLog("02")
    second.check("y", True)
    second.not_checked("z", "needs 2 GPUs")
    second.tally()
    assert [json.loads(line)["notebook"] for line in path.read_text().splitlines()] == ["01", "02"]
    summary = summarize_lesson_log(path)
    assert summary.splitlines()[0] == "lessons: 2 of 3 checked in 2 notebooks; 0 of the 2 rejected a named rival, 0 need none (said why), 2 say neither"
    assert "NOT CHECKED in 02: z (needs 2 GPUs)" in summary
    with pytest.raises(LessonLogError, match="missing.jsonl does not exist"):
        summarize_lesson_log(tmp_path / "missing.jsonl")


def test_the_tally_command_fails_on_a_missing_cut_or_unreadable_log(tmp_path):
    """`python -m labkit.core.lessons FILE`: exit 1 and one line, never '0 of 0 checked' for nothing."""
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"notebook": "01", "checked": ["x"], "not_checked": {}}\n{"notebook": "02", "chec')
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, words in ((tmp_path / "none.jsonl", "does not exist"), (cut, "line 2 is not a lesson tally"),
                        (folder, "cannot be read")):
        proc = subprocess.run([sys.executable, "-m", "labkit.core.lessons", str(path)], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 1 and proc.stdout == "" and words in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    proc = subprocess.run([sys.executable, "-m", "labkit.core.lessons", str(empty)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "holds no lesson tally" in proc.stderr and proc.stdout == ""
    good = tmp_path / "good.jsonl"
    good.write_text('{"notebook": "01", "checked": ["x"], "not_checked": {}}\n')
    assert main([str(good)]) == 0 and main([]) == 2


def test_not_checked_all_counts_every_claim_of_a_section(capsys):
    log = LessonLog("nb")
    log.not_checked_all(["a holds", "b holds"], "needs MPI")
    assert log.total == 2 and capsys.readouterr().out.count("NOT CHECKED:") == 2
    with pytest.raises(ValueError, match="reason"):
        log.not_checked_all(["c holds"], " ")


def test_inconclusive_is_printed_tallied_on_its_own_line_and_never_counted_as_checked(capsys, tmp_path,
                                                                                       monkeypatch):
    from labkit.core.verdict import Load, judge_agreement
    path = tmp_path / "lessons.jsonl"
    monkeypatch.setenv("LABKIT_LESSON_LOG", str(path))
    log = LessonLog("07")
    log.check("a", True)
    busy = Load({"rank 0": 0.46}, spread=0.1)
    verdict = log.decide(judge_agreement("it pays", predicted=1.65, measured=0.84, tolerance=0.25, load=busy))
    assert verdict.state == "INCONCLUSIVE"
    assert "INCONCLUSIVE (load): it pays (predicted 1.65x" in capsys.readouterr().out
    first, second = log.tally().splitlines()
    assert first == "07: 1 of 2 lessons checked (0 rejected a named rival, 0 need none)"
    assert second.startswith("07: 1 INCONCLUSIVE (load 1, spread 0, statistics 0)") and "rank 0 got 0.46 of a core" in second
    summary = summarize_lesson_log(path).splitlines()
    assert summary[0] == "lessons: 1 of 2 checked in 1 notebooks; 0 of the 1 rejected a named rival, 0 need none (said why), 1 say neither"
    assert summary[1] == "INCONCLUSIVE: 1 (load 1, spread 0, statistics 0)"
    assert summary[2].startswith("  INCONCLUSIVE in 07: it pays (")
    log.decide(judge_agreement("it pays", predicted=1.65, measured=1.6, tolerance=0.25, load=busy))
    assert log.inconclusive_reasons == {} and log.checked == ["a", "it pays"]
    with pytest.raises(AssertionError, match="a wrong model.*larger than this run's load can explain"):
        log.decide(judge_agreement("a wrong model", predicted=4.0, measured=0.84, tolerance=0.25, load=busy))
    with pytest.raises(ValueError, match="measured reason"):
        log.inconclusive("b", "")


def test_summary_reads_tallies_written_before_inconclusive_existed(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"notebook": "01", "checked": ["x"], "not_checked": {}}) + "\n")
    assert summarize_lesson_log(path).splitlines()[:2] == [
        "lessons: 1 of 1 checked in 1 notebooks; 0 of the 1 rejected a named rival, 0 need none (said why), 1 say neither",
        "INCONCLUSIVE: 0 (load 0, spread 0, statistics 0)"]


def test_exercise_tallies_in_the_same_log_are_left_to_their_own_command(tmp_path):
    log = tmp_path / "lessons.jsonl"
    log.write_text('{"notebook": "01", "checked": ["x"], "not_checked": {}}\n'
                   '{"kind": "exercises", "notebook": "01", "results": {}}\n')
    assert summarize_lesson_log(log).startswith("lessons: 1 of 1 checked in 1 notebooks")


def test_one_log_writer_and_reader_for_lesson_and_exercise_tallies(tmp_path, monkeypatch):
    from labkit.core.lessons import append_to_lesson_log, last_record_per_notebook

    log = tmp_path / "lessons.jsonl"
    monkeypatch.setenv("LABKIT_LESSON_LOG", str(log))
    append_to_lesson_log({"notebook": "a", "checked": ["x"], "not_checked": {}})
    append_to_lesson_log({"kind": "exercises", "notebook": "a", "total": 2, "attempted": 1, "correct": 1})
    append_to_lesson_log({"notebook": "a", "checked": ["x", "y"], "not_checked": {}})
    assert last_record_per_notebook(log, None)["a"]["checked"] == ["x", "y"]          # the last tally wins
    assert last_record_per_notebook(log, "exercises")["a"]["correct"] == 1
    monkeypatch.delenv("LABKIT_LESSON_LOG")
    append_to_lesson_log({"notebook": "b"})                                            # unset: nothing written
    assert len(log.read_text().splitlines()) == 3


def test_a_tally_that_does_not_fit_on_the_disk_leaves_the_log_whole(tmp_path, monkeypatch):
    from labkit.core.lessons import append_to_lesson_log
    from labkit.core.results import WriteError
    from tests.fault_support import fill, tiny_tmpfs

    with tiny_tmpfs(tmp_path) as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        log = mount / "lessons.jsonl"
        log.write_text('{"notebook": "01", "checked": ["x"], "not_checked": {}}\n')
        fill(mount)
        monkeypatch.setenv("LABKIT_LESSON_LOG", str(log))
        with pytest.raises(WriteError, match=f"cannot write {log}: the disk is full"):
            append_to_lesson_log({"notebook": "02", "checked": ["y" * 20000], "not_checked": {}})
        assert summarize_lesson_log(log).startswith("lessons: 1 of 1 checked in 1 notebooks")   # no half line


def test_a_gpu_lesson_is_judged_on_a_gpu_and_not_checked_elsewhere_with_what_it_measured():
    log = LessonLog("nb")
    assert log.judged_on_gpu("on a GPU batch 1 is launch-bound", True, "NVIDIA H100 (cuda:0)", "c/t(1) = 0.8")
    assert log.not_checked_reasons == {}
    assert not log.judged_on_gpu("on a GPU batch 1 is launch-bound", False, "cpu", "c/t(1) = 0.04")
    reason = log.not_checked_reasons["on a GPU batch 1 is launch-bound"]
    assert "ran on cpu" in reason and "c/t(1) = 0.04" in reason


# ---- issue 51: each claim names its rival, and a band that admits it fails
def test_a_rival_inside_the_band_fails_every_verdict_kind_busy_or_quiet():
    """Each verdict kind fed a run where the rival is true: the check cannot tell them apart and fails."""
    from labkit.core.claims import judge_band
    from labkit.core.verdict import Load, Rival, judge_agreement, judge_at_least, judge_at_most

    busy = Load({"rank 0": 0.4}, spread=0.5)
    gpipe_m8 = 3 / 11                                      # (p-1)/(m+p-1) at p=4, m=8; the rival (p-1)/m = 3/8
    wide = [judge_agreement("bubble", gpipe_m8, 0.30, tolerance=0.4, rival=Rival("(p-1)/m", 3 / 8)),
            judge_agreement("bubble", gpipe_m8, 0.30, tolerance=0.4, rival=Rival("(p-1)/m", 3 / 8), load=busy),
            judge_at_least("faster", 1.5, 0.9, rival=Rival("no speed-up", 1.0)),
            judge_at_most("overhead", 0.5, 1.2, rival=Rival("no saving", 1.0)),
            judge_band("ring peak", 0.9, 0.455, 1.40, rival=Rival("no K/V buffers", 0.7), source="CI reading")]
    for verdict in wide:
        assert verdict.state == "failed" and "cannot tell the claim from its rival" in verdict.detail, verdict
    narrow = [judge_agreement("bubble", gpipe_m8, 0.28, tolerance=0.15, rival=Rival("(p-1)/m", 3 / 8)),
              judge_at_least("faster", 1.5, 1.2, rival=Rival("no speed-up", 1.0)),
              judge_band("ring peak", 0.9, 0.8, 1.2, rival=Rival("no K/V buffers", 0.7), source="fp32 rounding")]
    for verdict in narrow:
        assert verdict.state == "checked" and "rules out" in verdict.detail and verdict.rival, verdict


def test_a_statistical_agreement_too_wide_to_reject_its_rival_is_inconclusive_for_statistics(capsys):
    """02b's case: two noise-scale estimates 'agree within 3 standard errors' with standard errors of 84-337 %:
    the rival 'a factor of 2 apart' is inside 3 standard errors, so it is INCONCLUSIVE (statistics) with the samples
    it would take; tight errors check it; far apart fails."""
    from labkit.core.claims import judge_within_errors, samples_to_reject
    from labkit.core.verdict import Rival

    loose = judge_within_errors("B agrees", 100.0, 130.0, 90.0, rival=Rival("a factor of 2", 200.0), samples=30)
    assert loose.state == "INCONCLUSIVE" and loose.kind == "statistics" and "samples would settle it" in loose.detail
    assert samples_to_reject(30, 90.0, 3.0, 100.0) == 219 and "about 219 samples" in loose.detail  # 30 x 2.7^2
    tight = judge_within_errors("B agrees", 100.0, 110.0, 10.0, rival=Rival("a factor of 2", 200.0), samples=300)
    assert tight.state == "checked" and "rules out a factor of 2 = 200" in tight.detail
    apart = judge_within_errors("B agrees", 100.0, 160.0, 10.0, rival=Rival("a factor of 2", 200.0), samples=300)
    assert apart.state == "failed"
    log = LessonLog("02b")
    log.decide(loose)
    log.decide(tight.__class__("other", "checked", tight.detail, rival=tight.rival))
    assert "INCONCLUSIVE (statistics): B agrees" in capsys.readouterr().out
    tally = log.tally()
    assert tally.startswith("02b: 1 of 2 lessons checked (1 rejected a named rival, 0 need none)")
    assert "02b: 1 INCONCLUSIVE (load 0, spread 0, statistics 1)" in tally          # each kind counted on its own


def test_paired_rounds_that_straddle_the_band_are_inconclusive_for_spread_and_bad_kinds_are_refused():
    from labkit.core.verdict import Verdict, judge_agreement

    verdict = judge_agreement("agrees", 1.0, 1.5, tolerance=0.2, by_round=[(1.0, 0.9), (1.0, 1.6), (1.0, 1.1)])
    assert verdict.state == "INCONCLUSIVE" and verdict.kind == "spread"
    with pytest.raises(ValueError, match="INCONCLUSIVE kind"):
        Verdict("x", "INCONCLUSIVE", "why", kind="bad luck")
    with pytest.raises(ValueError, match="INCONCLUSIVE kind"):
        LessonLog("nb").inconclusive("x", "why", kind="bad luck")


def test_a_passing_check_prints_the_rival_it_ruled_out(capsys):
    log = LessonLog("05")
    log.check("the bubble follows (p-1)/(m+p-1)", True, "measured 0.38", rival="(p-1)/m = 0.5")
    log.check("already said", True, "measured 1; rules out none = 2", rival="none = 2")
    out = capsys.readouterr().out
    assert "\u2713 the bubble follows (p-1)/(m+p-1) (measured 0.38; rules out (p-1)/m = 0.5)" in out
    assert out.count("rules out none = 2") == 1
    log.check("a figure, not a sentence", True, 0.297, rival="FLOPs from all parameters")    # details may be numbers
    assert "(0.297; rules out FLOPs from all parameters)" in capsys.readouterr().out


def test_a_claim_says_why_no_rival_applies_and_the_totals_count_it_apart(tmp_path, monkeypatch, capsys):
    log_file = tmp_path / "lessons.jsonl"
    monkeypatch.setenv("LABKIT_LESSON_LOG", str(log_file))
    log = LessonLog("demo")
    log.check("the ranks' sum equals one process's", True, "max diff 0", no_rival="an exact equality")
    with log.lesson("the gradients match", no_rival="compared with an independent computation"):
        assert True
    log.check("a speed-up", True, "2.0x", rival="no speed-up (1.0x)")
    log.check("a bare claim", True)
    assert log.tally() == "demo: 4 of 4 lessons checked (1 rejected a named rival, 2 need none)"
    assert summarize_lesson_log(log_file).splitlines()[0] == (
        "lessons: 4 of 4 checked in 1 notebooks; 1 of the 4 rejected a named rival, 2 need none (said why), "
        "1 say neither")
    with pytest.raises(ValueError, match="not both"):
        log.check("both", True, rival="x", no_rival="y")
