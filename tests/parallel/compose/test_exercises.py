"""Notebook 18's exercises: each reference is right on a hand-worked case and each planted mistake is caught; the
live one, mesh_groups, judged on 4 gloo ranks against init_device_mesh's groups, hostile answers given one line."""
import dataclasses

import pytest
import torch

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.comm.mesh import Mesh
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, Exercise
from labkit.parallel.compose import exercises as cx
from tests.exercise_support import assert_caught, assert_one_line_each, assert_sound, assert_timed_out, notebook_rank_stub


def test_dp_group_by_hand():
    assert cx.dp_group_reference(3, dp=2, pp=1, cp=1, tp=2) == [1, 3]
    assert cx.dp_group_reference(5, dp=2, pp=2, cp=1, tp=2) == [1, 5]        # ranks pp * cp * tp = 4 apart


def test_broken_rule_names_the_first_rule_broken():
    base = {"heads": 8, "layers": 8, "seq_len": 64, "batch": 8, "dp": 2, "pp": 2, "cp": 2, "tp": 2}
    assert cx.broken_rule_reference(**base) == "none"
    assert cx.broken_rule_reference(**{**base, "seq_len": 12}) == "seq"       # 12 % (2 x 2*2) != 0
    assert cx.broken_rule_reference(**{**base, "batch": 6, "dp": 4}) == "dp"
    assert {c["seq_len"] for c in cx._broken_rule_cases()} >= {12, 64}


def test_ring_bytes_by_hand_and_the_notebooks_case_first():
    # b=4, s=32 over cp=2, h=64 over tp=2: a K/V block of 2*4*16*32 floats = 16 KiB, passed 3*2-2 = 4 times
    assert cx.ring_bytes_reference(4, 32, 64, 2, 2, 4) == 4 * 16384
    assert cx.ring_bytes_cases_for(4, 32, 64, 2, 2)[0]["seq_len"] == 32


EXERCISES = [v for v in vars(cx).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


# ------------------------------------------------------------------ mesh_groups, judged on 4 live gloo ranks
SEED = 99
FAST = dataclasses.replace(cx.MESH_GROUPS, case_s=4.0, start_s=25.0)


def judge_live(answer, exercise=FAST):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def test_the_model_answer_is_the_meshs_grid_and_each_rival_differs_on_some_grid():
    cases = cx.mesh_groups_cases()
    assert sorted((c["dp"], c["tp"]) for c in cases) == [(1, 4), (2, 2), (4, 1)]
    for c in cases:
        grid = Mesh(dp=c["dp"], tp=c["tp"])
        assert cx.mesh_groups(**c) == (grid.members("tp"), grid.members("dp"))
    for rival in (cx._dp_fastest, cx._one_group):
        assert any(rival(**c) != cx.mesh_groups(**c) for c in cases)


def both_answers(cases: list[dict]) -> list:
    """In a rank: per case, what the all-reduces found in the model answer's groups and in the DeviceMesh's."""
    return [[cx.mesh_groups_case(cx.mesh_groups, **c), cx.mesh_groups_case(cx.device_mesh_groups, **c)] for c in cases]


def test_on_live_ranks_the_model_answers_groups_reduce_like_init_device_meshs(own_tmp):
    cases = cx.mesh_groups_cases()
    ranks = launch(both_answers, 4, args=(cases,), backend="gloo", timeout_s=120, show_output=False)
    for rank, per_case in enumerate(ranks):
        for c, (mine, torchs) in zip(cases, per_case):
            grid = Mesh(dp=c["dp"], tp=c["tp"])
            assert mine == torchs == {"tp": grid.group_of(rank, "tp"), "dp": grid.group_of(rank, "dp")}


def test_a_learner_written_mesh_groups_is_correct(own_tmp):
    def my_groups(dp, tp):
        ranks = torch.arange(dp * tp).reshape(dp, tp)
        return ranks.tolist(), ranks.T.tolist()

    verdict = judge_live(my_groups)
    assert verdict.status == CORRECT and "on 4 live ranks" in verdict.text, verdict.text


@pytest.mark.parametrize("mistake", ["dp_fastest", "one_group"])
def test_each_rival_is_caught_on_live_ranks_with_its_own_hint(own_tmp, mistake):
    wrong = {m.name: m for m in cx.MESH_GROUPS.mistakes}[mistake]
    verdict = judge_live(wrong.answer)
    assert_caught(verdict, wrong)


def test_hostile_mesh_groups_each_get_one_line(own_tmp):
    def raises(dp, tp):
        raise RuntimeError("no")

    def loses_a_rank(dp, tp):
        return [list(range(dp * tp - 1))], [list(range(dp * tp))]

    said = {f.__name__: judge_live(f).text for f in (raises, loses_a_rank)}
    assert "your code raised RuntimeError: no (case 1" in said["raises"]
    assert "must hold each of the 4 ranks once" in said["loses_a_rank"]
    assert_one_line_each(said, "mesh_groups")


def test_a_mesh_groups_that_sleeps_forever_meets_the_timeout(own_tmp):
    def sleeps(dp, tp):
        import time
        time.sleep(600)

    one_case = dataclasses.replace(FAST, cases=lambda seed=0: cx.mesh_groups_cases(seed)[:1], case_s=2.0)
    verdict = judge_live(sleeps, one_case)                  # 2 cases: 25 + 2 x 2 = 29 s
    assert_timed_out(verdict, 29)


def test_the_notebooks_rank_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    stub = notebook_rank_stub("18_one_mesh.ipynb", "MESH_GROUPS", cx.mesh_groups, tmp_path)
    assert judge_live(stub).status == NOT_ATTEMPTED
