"""The live-rank judge: a learner's function shipped to 2 gloo ranks by its source, judged beside the kit's answers.

A small exercise stands in for every "write the distributed code" exercise: all-reduce (sum) a seeded tensor. Each
hostile answer (raises, hangs, ends its process, uses a notebook global, the shown-cases table) gets one verdict line,
and no process or folder is left behind."""
from __future__ import annotations

import dataclasses
import os
import random
import time

import pytest
import torch
import torch.distributed as dist

from labkit.comm import rank_answers as ra
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, ExerciseBook, Mistake

SEED = 4321
NOTEBOOK_SCALE = 3.0        # a notebook global the 'uses a global' answer reads


def tensor_case(answer, n: int, seed: int) -> list[float]:
    """In a rank: a seeded tensor of n numbers, different per rank, through the answer."""
    gen = torch.Generator().manual_seed(seed + dist.get_rank())
    return answer(torch.randn(n, generator=gen)).tolist()


def summed(tensor):
    """The sum over the ranks (the expected answer and the model answer)."""
    dist.all_reduce(tensor)
    return tensor


def local_only(tensor):
    """Mistake: this rank's own numbers."""
    return tensor


def tensor_cases(seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    return [{"n": rng.randint(2, 9), "seed": rng.randrange(1000)} for _ in range(2)]


SUM = ra.RankExercise("sum_on_ranks", "all-reduce the tensor (sum) and return it", summed, summed, tensor_case,
                      tensor_cases, (Mistake("local", local_only, "all-reduce it: these are this rank's numbers"),),
                      "call dist.all_reduce(tensor) and return tensor", case_s=4.0, start_s=20.0)


def judge(answer, exercise=SUM):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def test_the_model_answer_is_correct_on_shown_and_fresh_cases(own_tmp):
    verdict = judge(summed)
    assert verdict.status == CORRECT and "right on all 4 cases (2 of them fresh) on 2 live ranks" in verdict.text


def test_a_typical_mistake_gets_its_own_hint(own_tmp):
    def mine(tensor):
        return tensor * 1.0

    verdict = judge(mine)
    assert verdict.status == WRONG and verdict.mistake == "local", verdict.text
    assert "all-reduce it" in verdict.text and "your ranks disagree" in verdict.text


def test_a_table_of_the_shown_cases_fails_on_fresh_ones(own_tmp):
    def doubled_if_short(tensor):
        import torch.distributed as dist
        dist.all_reduce(tensor)
        return tensor if len(tensor) in (4, 7) else tensor * 2      # the shown cases' sizes (seed 7)

    assert sorted(c["n"] for c in tensor_cases()) == [4, 7]
    verdict = judge(doubled_if_short)
    assert verdict.status == WRONG and "a fresh case, drawn for this check" in verdict.text, verdict.text


def test_the_stub_is_not_attempted_without_starting_a_rank(own_tmp):
    def stub(tensor):
        """Your code."""
        ...  # your code here

    start = time.perf_counter()
    assert judge(stub).status == NOT_ATTEMPTED and judge(None).status == NOT_ATTEMPTED
    assert time.perf_counter() - start < 1.0


def test_a_notebook_global_is_named_in_one_line(own_tmp):
    def scaled(tensor):
        dist.all_reduce(tensor)
        return tensor * NOTEBOOK_SCALE

    verdict = judge(scaled)
    assert verdict.status == WRONG and "uses NOTEBOOK_SCALE, defined outside it" in verdict.text
    assert len(verdict.text.splitlines()) == 1


def test_closures_lambdas_and_other_arguments_are_refused_in_one_line(own_tmp):
    factor = 2.0

    def closed(tensor):
        return tensor * factor

    def renamed(t):
        return t

    assert "uses factor from an enclosing function" in judge(closed).text
    assert "not a function" in judge(lambda tensor: tensor).text or "with def" in judge(lambda tensor: tensor).text
    assert "keep the stub's arguments (tensor)" in judge(renamed).text


def test_a_raising_answer_gets_one_line_naming_its_exception(own_tmp):
    def raises(tensor):
        raise ValueError("boom")

    verdict = judge(raises)
    assert verdict.status == WRONG and "your code raised ValueError: boom (case 1" in verdict.text, verdict.text
    assert len(verdict.text.splitlines()) == 1


def test_a_hanging_answer_meets_the_launchers_timeout(own_tmp):
    def hangs(tensor):
        import time
        time.sleep(600)

    quick = dataclasses.replace(SUM, case_s=1.0, start_s=8.0)
    start = time.perf_counter()
    verdict = judge(hangs, quick)
    assert time.perf_counter() - start < 30
    assert verdict.status == WRONG and "within 12 s, the launcher's timeout" in verdict.text, verdict.text
    assert len(verdict.text.splitlines()) == 1


def test_an_answer_that_ends_its_process_is_named(own_tmp):
    def exits(tensor):
        import os
        import torch.distributed as dist
        if dist.get_rank() == 1:
            os._exit(3)
        dist.all_reduce(tensor)
        return tensor

    verdict = judge(exits)
    assert verdict.status == WRONG and "rank 1's process ended while running your code" in verdict.text, verdict.text
    assert len(verdict.text.splitlines()) == 1


def test_the_book_records_the_verdict_and_reveals_the_model_answer(own_tmp, capsys):
    book = ExerciseBook("rank-test")
    SUM.check(book, summed, seed=SEED)
    book.reveal(SUM)
    out = capsys.readouterr().out
    assert book.counts() == (1, 1, 1) and "dist.all_reduce(tensor)" in out


def test_the_shipped_source_is_the_def_alone_below_the_preamble():
    def mine(tensor):
        total = sum(int(x) for x in range(3))
        return tensor * total

    source = ra.answer_source(mine)
    assert source.startswith(ra.PREAMBLE) and "def mine(tensor):" in source and "NOTEBOOK" not in source
    assert ra.outside_names(mine) == []
    assert not ra.unfilled(mine) and ra.unfilled(...)


def test_a_kit_defect_is_not_blamed_on_the_learner(own_tmp):
    broken = dataclasses.replace(SUM, run_case=broken_case)
    with pytest.raises(Exception, match="kit broke"):
        ra.judge_on_ranks(broken, summed, seed=SEED)


def broken_case(answer, n: int, seed: int) -> list[float]:
    """A run_case with a defect of its own."""
    raise RuntimeError("kit broke")


def test_a_rank_exercise_refuses_answers_the_ranks_cannot_import():
    with pytest.raises(ValueError, match="cannot send"):
        dataclasses.replace(SUM, expected=lambda tensor: tensor)
    assert os.path.basename(ra.ShippedAnswer("/x", "f").path) == "answer.py"


def test_an_answer_whose_cell_fails_on_import_is_named_as_raising(tmp_path, monkeypatch):
    """The file the ranks import raises (e.g. an unknown name in an annotation): the rank marks it raised, so the
    verdict quotes the error instead of 'the process ended without an exception'."""
    monkeypatch.setenv("RANK", "1")
    (tmp_path / ra.ANSWER_FILE).write_text("def f(x: UnknownName):\n    return x\n")
    shipped = ra.ShippedAnswer(str(tmp_path), "f")
    with pytest.raises(ra.AnswerRaised, match="NameError on import"):
        ra.load_answer(shipped)
    assert "UnknownName" in (tmp_path / "raised.1").read_text()


def test_ranks_that_should_differ_are_not_called_a_disagreement():
    """Where the kit's own outputs differ by rank (a pipeline's last stage), 'your ranks disagree' is noise."""
    cases = [{"n": 2}]
    per_rank_want = [[[1.0], [2.0]]]                 # rank 0 and rank 1 should return different things
    line, bad = ra._wrong_line(SUM, cases, 1, [[[1.0], [3.0]]], per_rank_want)
    assert bad == 1 and "disagree" not in line and "rank 1 got" in line
    same_want = [[[2.0], [2.0]]]                     # an all-reduce: every rank should hold the same
    line, _ = ra._wrong_line(SUM, cases, 1, [[[2.0], [3.0]]], same_want)
    assert "your ranks disagree (rank 1 differs from rank 0)" in line
