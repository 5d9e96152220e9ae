"""The checked exercises of labkit.sharding.exercises: references pass, typical mistakes get their hints; the ZeRO
bytes task solvable as written; the live-rank zero_step exercise judged against one single-process SGD step on 2 gloo
ranks, each rival caught with its own hint, a wrong return given one line and a hanging answer stopped in time."""
import dataclasses

import pytest
import torch
import torch.distributed as dist

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.answers import FLOAT32_REL_TOL, mismatch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, Exercise
from labkit.sharding import exercises
from tests.exercise_support import assert_caught, assert_sound, notebook_rank_stub

EXERCISES = [v for v in vars(exercises).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_following_the_zero_bytes_task_solves_every_case_however_it_divides():
    """Issue 52: the task says num_params is a multiple of R, so float division, // on the total and // per term
    all give the reference's int on every case, shown and fresh (the rounding rival no longer exists)."""
    def by_term(num_params, strategy, world_size, divide):
        n, r = num_params, world_size
        p, g, o = {"ddp": (1, 1, 1), "zero1": (1, 1, r), "zero2": (1, r, r), "zero3": (r, r, r)}[strategy]
        return divide(2 * n, p) + divide(2 * n, g) + divide(12 * n, o)

    for seed in (None, 1, 2, 3, 4, 5):
        cases = exercises._zero_cases() if seed is None else exercises._zero_cases(seed=seed)
        for case in cases:
            want = exercises.zero_bytes_reference(**case)
            assert case["num_params"] % case["world_size"] == 0, case
            for divide in (lambda a, b: a / b, lambda a, b: a // b):
                assert mismatch(by_term(**case, divide=divide), want, FLOAT32_REL_TOL) is None, case


# ------------------------------------------------------------------ 11's live-rank exercise: zero_step
SEED = 99
ZERO = dataclasses.replace(exercises.ZERO_STEP, case_s=4.0, start_s=20.0)


def judge(answer, exercise=ZERO):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def model_answer_is_one_sgd_step(cases: list[dict]) -> list[bool]:
    """In a rank: per case, the model answer equals the single-process step bit for bit, and its shard is 1/R."""
    return [exercises.zero_case(exercises.zero_step, **c) == exercises.zero_case(exercises.single_process_step, **c)
            and 2 * len(exercises.zero_case(exercises.zero_step, **c)[0]) == len(
                exercises.zero_case(exercises.zero_step, **c)[1]) for c in cases]


def test_the_model_answer_is_one_single_process_sgd_step(own_tmp):
    cases = exercises.zero_cases() + exercises.zero_cases(seed=SEED)
    assert launch(model_answer_is_one_sgd_step, 2, args=(cases,), backend="gloo", timeout_s=90,
                  show_output=False) == [[True] * 4] * 2


def test_a_learner_written_zero_step_is_correct_and_each_rival_gets_its_own_hint(own_tmp):
    def zero_step(params, grad, lr):
        r, me = dist.get_world_size(), dist.get_rank()
        total = grad.clone()
        dist.all_reduce(total)                               # the all-reduce-then-slice way, also right
        shard = params.chunk(r)[me] - lr * total.chunk(r)[me] / r
        parts = [torch.empty_like(shard) for _ in range(r)]
        dist.all_gather(parts, shard)
        return shard, torch.cat(parts)

    verdict = judge(zero_step)
    assert verdict.status == CORRECT and "on 2 live ranks" in verdict.text, verdict.text
    for wrong in exercises.ZERO_STEP.mistakes:
        verdict = judge(wrong.answer)
        assert_caught(verdict, wrong)


def test_hostile_answers_get_one_line_and_a_hanging_one_meets_the_timeout(own_tmp):
    def returns_one_tensor(params, grad, lr):
        return params

    def sleeps(params, grad, lr):
        import time
        time.sleep(600)

    said = judge(returns_one_tensor).text
    assert said.startswith("[zero_step] wrong") and "your code raised TypeError: zero_step returned Tensor" in said
    hung = judge(sleeps, dataclasses.replace(ZERO, case_s=2.0, start_s=20.0))   # 20 + 2 x 4 = 28 s
    assert hung.status == WRONG and "within 28 s, the launcher's timeout" in hung.text, hung.text
    assert all(len(t.splitlines()) == 1 for t in (said, hung.text))


def test_the_notebooks_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    """The stub (tagged rank-exercise-stub) reads 'not attempted yet', launches nothing and has the model answer's
    arguments; the check cell (rank-exercise-check) hands it to ex.ZERO_STEP.check."""
    stub = notebook_rank_stub("11_sharding_and_memory.ipynb", "ZERO_STEP", exercises.zero_step, tmp_path)
    assert judge(stub).status == NOT_ATTEMPTED
