"""Notebook 17's live-rank exercise: a learner's DDP comm hook judged on 2 gloo ranks by its gradients against DDP's
default hook's, each rival caught with its own hint, hostile hooks given one line each; the overlap verdict decided
on paired rounds against the rival 'no overlap', INCONCLUSIVE (never failed) where the rounds cannot tell."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG
from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE
from labkit.parallel.overlap import exercises as ovx
from labkit.parallel.overlap import hook_exercise as hx
from tests.exercise_support import assert_caught, assert_one_line_each, assert_timed_out, notebook_rank_stub

SEED = 99
GRADS = dataclasses.replace(hx.OVERLAP_HOOK, measure=None, case_s=4.0, start_s=20.0)   # gradients only: fast


def judge(answer, exercise=GRADS):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def both_hooks(cases: list[dict]) -> list[bool]:
    """In a rank: per case, whether the model answer's gradients equal DDP's default hook's, bit for bit."""
    return [hx.hook_case(hx.overlap_hook, **c) == hx.hook_case(hx.allreduce_hook, **c) for c in cases]


def test_the_model_answer_gives_ddps_default_gradients_bit_for_bit():
    cases = hx.hook_cases() + hx.hook_cases(seed=SEED)
    assert launch(both_hooks, 2, args=(cases,), backend="gloo", timeout_s=90, show_output=False) == [[True] * 4] * 2


def test_the_notebook_reaches_the_exercise_and_the_stub_is_not_attempted(own_tmp):
    def overlap_hook(state, bucket):
        """Return a torch.futures.Future holding the averaged bucket."""
        ...  # your code here

    assert ovx.OVERLAP_HOOK is hx.OVERLAP_HOOK
    assert judge(overlap_hook).status == NOT_ATTEMPTED


def test_a_learner_written_overlapping_hook_is_correct(own_tmp):
    def my_hook(state, bucket):
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0] / dist.get_world_size())

    verdict = judge(my_hook)
    assert verdict.status == CORRECT and "on 2 live ranks" in verdict.text, verdict.text


@pytest.mark.parametrize("mistake", ["summed", "rank_local"])
def test_each_rival_is_caught_with_its_own_hint(own_tmp, mistake):
    wrong = {m.name: m for m in hx.OVERLAP_HOOK.mistakes}[mistake]
    verdict = judge(wrong.answer)
    assert_caught(verdict, wrong)


def test_a_hook_that_returns_the_right_kind_of_output_without_reducing_is_rank_local(own_tmp):
    def no_reduce(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer().clone())
        return fut

    verdict = judge(no_reduce)
    assert verdict.status == WRONG and verdict.mistake == "rank_local", verdict.text


def test_hostile_hooks_each_get_one_line(own_tmp):
    def raises(state, bucket):
        raise RuntimeError("no")

    def returns_none(state, bucket):
        dist.all_reduce(bucket.buffer())

    def exits(state, bucket):
        import os
        os._exit(4)

    said = {f.__name__: judge(f).text for f in (raises, returns_none, exits)}
    assert "your code raised RuntimeError: no (case 1" in said["raises"]
    assert "the hook returned NoneType, not a torch.futures.Future" in said["returns_none"]
    assert "process ended while running your code" in said["exits"] and "exit code 4" in said["exits"]
    assert_one_line_each(said, "overlap_hook")


def test_a_hook_that_sleeps_forever_meets_the_timeout(own_tmp):
    def sleeps(state, bucket):
        import time
        time.sleep(600)

    verdict = judge(sleeps, dataclasses.replace(GRADS, case_s=2.0, start_s=20.0))   # 28 s: the kit's answers, then it
    assert_timed_out(verdict, 28)


def rounds_of(none, default, waiting, answer, share=1.0, n=12):
    """Two ranks' timing results with the given backward seconds per variant (rank 1 a hair slower)."""
    def one(rank, bump):
        times = {"none": none, "default": default, "waiting": waiting, "answer": answer}
        return {"rank": rank, "cpu_share": share, "backward_s": {k: [v * (1 + 0.01 * ((i * 7) % 5 - 2)) + bump
                                                                     for i in range(n)] for k, v in times.items()}}
    return [one(0, 0.0), one(1, 1e-4)]


def test_overlap_verdict_passes_a_hiding_hook_and_fails_a_waiting_one_on_a_quiet_machine():
    hiding = hx.overlap_verdict(rounds_of(0.015, 0.040, 0.060, 0.041))
    assert hiding.state == CHECKED and "yours" in hiding.detail and "rival" in hiding.detail, hiding.detail
    waiting = hx.overlap_verdict(rounds_of(0.015, 0.040, 0.060, 0.060))
    assert waiting.state == FAILED, waiting.detail


def test_overlap_verdict_is_inconclusive_when_busy_or_when_the_default_hides_nothing():
    busy = hx.overlap_verdict(rounds_of(0.015, 0.040, 0.060, 0.060, share=0.3))
    assert busy.state == INCONCLUSIVE and "of a core" in busy.detail, busy.detail
    unresolved = hx.overlap_verdict(rounds_of(0.015, 0.050, 0.050, 0.050))
    assert unresolved.state == INCONCLUSIVE and "hid no communication" in unresolved.detail


def test_a_failed_timing_names_the_waiting_mistake(monkeypatch):
    monkeypatch.setattr(hx, "namespace_support", lambda: ("root", "as root"))
    monkeypatch.setattr(hx, "run_job", lambda *a, **k: type("R", (), {"results": rounds_of(.015, .04, .06, .06)})())
    monkeypatch.setattr(hx, "EmulatedNodes", lambda config: _NoNodes())
    line, mistake = hx.measure_overlap(ra.ShippedAnswer("/nowhere", "f"))
    assert line.startswith("overlap FAILED") and mistake is hx.WAITING


def test_without_namespaces_the_timing_is_not_checked_and_says_why(monkeypatch):
    monkeypatch.setattr(hx, "namespace_support", lambda: (None, "unshare not found"))
    line, mistake = hx.measure_overlap(ra.ShippedAnswer("/nowhere", "f"))
    assert line.startswith("overlap NOT CHECKED: unshare not found") and mistake is None


class _NoNodes:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_model_answer_timed_live_on_a_shaped_link_is_never_failed(own_tmp):
    if hx.namespace_support()[0] is None:
        pytest.skip(hx.namespace_support()[1])
    with ra.ship_answer(hx.overlap_hook) as shipped:
        line, mistake = hx.measure_overlap(shipped)
    assert mistake is None and line.startswith(("overlap checked", "overlap INCONCLUSIVE")), line


def test_the_notebooks_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    """The shipped stub (tagged rank-exercise-stub) reads 'not attempted yet' and has the model answer's arguments;
    the check cell (rank-exercise-check) hands that stub to ex.OVERLAP_HOOK.check."""
    stub = notebook_rank_stub("17_overlap.ipynb", "OVERLAP_HOOK", hx.overlap_hook, tmp_path)
    assert judge(stub).status == NOT_ATTEMPTED
