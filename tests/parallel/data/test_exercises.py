"""The checked exercises of labkit.parallel.data.exercises: references pass, typical mistakes get their hints; the
live-rank sync_gradients exercise judged against DDP's gradients on 2 gloo ranks, each rival caught with its own
hint, a raising answer given one line and a hanging one stopped by the timeout."""
import dataclasses

import pytest
import torch.distributed as dist

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, Exercise
from labkit.parallel.data import exercises
from tests.exercise_support import assert_caught, assert_sound, notebook_rank_stub

EXERCISES = [v for v in vars(exercises).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_the_measured_case_comes_first_so_the_verdict_shows_it():
    cases = exercises.speedup_cases_for(0.2, 0.05, 2)
    assert cases[0] == {"t_comp_s": 0.2, "t_sync_s": 0.05, "world_size": 2} and len(cases) > 1


# ------------------------------------------------------------------ 07's live-rank exercise: sync_gradients(model)
SEED = 99
SYNC = dataclasses.replace(exercises.SYNC_GRADIENTS, case_s=4.0, start_s=20.0)


def judge(answer, exercise=SYNC):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def model_answer_is_ddp(cases: list[dict]) -> list[bool]:
    """In a rank: per case, whether the model answer's gradients equal DDP's, bit for bit, and differ from the
    rank's own (so the cases tell the rivals apart)."""
    return [exercises.sync_case(exercises.sync_gradients, **c) == exercises.sync_case(exercises.ddp_averaged, **c)
            != exercises.sync_case(exercises.local_gradients, **c) for c in cases]


def test_the_model_answer_gives_ddps_gradients_bit_for_bit(own_tmp):
    cases = exercises.sync_cases() + exercises.sync_cases(seed=SEED)
    assert launch(model_answer_is_ddp, 2, args=(cases,), backend="gloo", timeout_s=90,
                  show_output=False) == [[True] * 4] * 2


def test_a_learner_written_answer_is_correct_and_each_rival_gets_its_own_hint(own_tmp):
    def sync_gradients(model):
        for p in model.parameters():
            p.grad.div_(dist.get_world_size())
            dist.all_reduce(p.grad)

    verdict = judge(sync_gradients)
    assert verdict.status == CORRECT and "on 2 live ranks" in verdict.text, verdict.text
    for wrong in exercises.SYNC_GRADIENTS.mistakes:
        verdict = judge(wrong.answer)
        assert_caught(verdict, wrong)


def test_hostile_answers_get_one_line_and_a_hanging_one_meets_the_timeout(own_tmp):
    def raises(model):
        raise RuntimeError("no")

    def sleeps(model):
        import time
        time.sleep(600)

    said = judge(raises).text
    assert said.startswith("[sync_gradients] wrong") and "your code raised RuntimeError: no (case 1" in said, said
    hung = judge(sleeps, dataclasses.replace(SYNC, case_s=2.0, start_s=20.0))   # 20 + 2 x 4 cases = 28 s
    assert hung.status == WRONG and "within 28 s, the launcher's timeout" in hung.text, hung.text
    assert all(len(t.splitlines()) == 1 for t in (said, hung.text))


def test_the_notebooks_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    """The stub (tagged rank-exercise-stub) reads 'not attempted yet', launches nothing and has the model answer's
    arguments; the check cell (rank-exercise-check) hands it to ex.SYNC_GRADIENTS.check."""
    stub = notebook_rank_stub("07_synchronous_sgd.ipynb", "SYNC_GRADIENTS", exercises.sync_gradients, tmp_path)
    assert judge(stub).status == NOT_ATTEMPTED
