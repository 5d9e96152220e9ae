"""Notebook 15's live-rank exercise: a learner's ``dispatch_tokens`` judged on 3 gloo ranks against the kit's dispatch
(``labkit.parallel.experts.dispatch``), each rival (even splits, unsorted rows, counts never exchanged) caught with its
own hint, hostile answers given one line each, nothing left behind."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG
from labkit.parallel.experts import exercises as ex
from tests.exercise_support import assert_one_line_each, assert_timed_out, notebook_rank_stub

SEED = 77
FAST = dataclasses.replace(ex.DISPATCH, case_s=3.0, start_s=25.0)


def judge(answer, exercise=FAST):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def every_answer(cases: list[dict]) -> dict:
    """In a rank: per answer, its output on each case."""
    names = {"model": ex.dispatch_tokens, "kit": ex.kit_dispatch, **{m.name: m.answer for m in ex.DISPATCH.mistakes}}
    return {name: [ex.dispatch_case(fn, **c) for c in cases] for name, fn in names.items()}


def test_the_cases_have_uneven_and_zero_counts_and_every_mistake_differs_from_the_kit_on_each():
    cases = ex.dispatch_cases() + ex.dispatch_cases(seed=SEED)
    assert all(any(0 in row for row in c["counts"]) for c in cases)
    assert all(len({sum(row) for row in c["counts"]}) > 1 or len({n for row in c["counts"] for n in row}) > 1
               for c in cases)
    ranks = launch(every_answer, 3, args=(cases,), backend="gloo", timeout_s=90, show_output=False)
    for out in ranks:
        assert out["model"] == out["kit"]
        assert all(isinstance(rows, list) for rows in out["kit"])
    for name in ("even_splits", "unsorted", "no_counts"):
        assert all(any(r[name][i] != r["kit"][i] for r in ranks) for i in range(len(cases))), name
    assert all(isinstance(r["no_counts"][0], str) and "expects" in r["no_counts"][0] for r in ranks)


def test_rows_arrive_in_source_rank_order_each_sources_rows_in_their_order():
    case = {"counts": [[1, 2, 0], [0, 0, 3], [2, 1, 1]], "width": 2, "seed": 5}
    rank2 = launch(every_answer, 3, args=([case],), backend="gloo", timeout_s=60, show_output=False)[2]["kit"][0]
    firsts = [row[0] for row in rank2]          # 1000 x source rank + 5 + 2 x row index
    assert [int(v) // 1000 for v in firsts] == [1, 1, 1, 2] and firsts[:3] == sorted(firsts[:3])


def test_the_stub_is_not_attempted_and_launches_nothing(own_tmp):
    def dispatch_tokens(tokens, dest_rank):
        """Return the rows this rank received."""
        ...  # your code here

    assert judge(dispatch_tokens).status == NOT_ATTEMPTED


def test_a_learner_written_dispatch_is_correct(own_tmp):
    def my_dispatch(tokens, dest_rank):
        n = dist.get_world_size()
        counts = torch.tensor([int((dest_rank == j).sum()) for j in range(n)])
        got = [torch.zeros(n, dtype=counts.dtype) for _ in range(n)]
        dist.all_gather(got, counts)                            # the counts by all_gather: also right
        recv = [int(g[dist.get_rank()]) for g in got]
        out = tokens.new_zeros(sum(recv), tokens.shape[1])
        rows = torch.cat([tokens[dest_rank == j] for j in range(n)])
        dist.all_to_all_single(out, rows, output_split_sizes=recv, input_split_sizes=counts.tolist())
        return out

    verdict = judge(my_dispatch)
    assert verdict.status == CORRECT and "on 3 live ranks" in verdict.text, verdict.text


def even_splits(tokens, dest_rank):
    send = [len(c) for c in torch.arange(len(dest_rank)).tensor_split(dist.get_world_size())]
    got = torch.empty(len(send), dtype=torch.int64)
    dist.all_to_all_single(got, torch.tensor(send))
    out = torch.empty(int(got.sum()), tokens.shape[1])
    dist.all_to_all_single(out, tokens[torch.argsort(dest_rank, stable=True)], got.tolist(), send)
    return out


def unsorted(tokens, dest_rank):
    send = torch.bincount(dest_rank, minlength=dist.get_world_size())
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send)
    out = torch.empty(int(got.sum()), tokens.shape[1])
    dist.all_to_all_single(out, tokens, got.tolist(), send.tolist())
    return out


def no_counts(tokens, dest_rank):
    send = [int((dest_rank == j).sum()) for j in range(dist.get_world_size())]
    out = torch.empty(sum(send), tokens.shape[1])
    dist.all_to_all_single(out, tokens[torch.argsort(dest_rank, stable=True)], send, send)    # gloo would abort
    return out


@pytest.mark.parametrize("learner", [even_splits, unsorted, no_counts], ids=lambda f: f.__name__)
def test_each_rival_written_as_a_learner_would_is_caught_with_its_own_hint(own_tmp, learner):
    hint = {m.name: m.hint for m in ex.DISPATCH.mistakes}[learner.__name__]
    verdict = judge(learner)
    assert verdict.status == WRONG and verdict.mistake == learner.__name__ and hint in verdict.text, verdict.text


def test_hostile_answers_each_get_one_line(own_tmp):
    def raises(tokens, dest_rank):
        raise RuntimeError("no")

    def returns_none(tokens, dest_rank):
        return None

    said = {f.__name__: judge(f).text for f in (raises, returns_none)}
    assert "your code raised RuntimeError: no (case 1" in said["raises"]
    assert "returned NoneType, not a tensor" in said["returns_none"]
    assert_one_line_each(said, "moe_dispatch")


def test_an_answer_that_sleeps_forever_meets_the_timeout(own_tmp):
    def sleeps(tokens, dest_rank):
        import time
        time.sleep(600)

    verdict = judge(sleeps, dataclasses.replace(FAST, case_s=1.0, start_s=15.0))     # 21 s: 6 cases
    assert_timed_out(verdict, 21)


def test_the_notebooks_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    """The stub tagged rank-exercise-stub has the model answer's arguments; the check cell hands it to
    ex.DISPATCH.check."""
    stub = notebook_rank_stub("15_expert_parallelism.ipynb", "DISPATCH", ex.dispatch_tokens, tmp_path)
    assert judge(stub).status == NOT_ATTEMPTED
