"""Notebook 16's live-rank exercise: a learner's ``save_and_load`` judged on 2 gloo ranks by the files its folder
holds and the values loaded into the fresh model, against the kit's own DCP save and resume; each rival (torch.save
on rank 0, saved but never loaded) caught with its own hint, hostile answers given one line each, no file left."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from labkit.checkpoint import exercises as ckx
from labkit.checkpoint import save_exercise as sx
from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG
from tests.exercise_support import assert_one_line_each, assert_timed_out, notebook_rank_stub

SEED = 61
FAST = dataclasses.replace(sx.SAVE_AND_LOAD, case_s=3.0, start_s=25.0)


def judge(answer, exercise=FAST):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def every_answer(cases: list[dict]) -> dict:
    """In a rank: per kit answer, what each case left (files, fresh's values), and each case's saved values."""
    names = {"model": sx.save_and_load, "kit": sx.kit_save_and_load,
             **{m.name: m.answer for m in sx.SAVE_AND_LOAD.mistakes}}
    out = {name: [sx.save_load_case(fn, **c) for c in cases] for name, fn in names.items()}
    out["saved"] = [torch.cat([t.reshape(-1) for t in sx.seeded_mlp(c["width"], c["depth"], c["seed"])
                               .state_dict().values()]).tolist() for c in cases]
    return out


def test_the_kit_loads_the_saved_values_into_one_file_per_rank_and_each_rival_differs(own_tmp):
    cases = sx.save_load_cases() + sx.save_load_cases(seed=SEED)
    ranks = launch(every_answer, 2, args=(cases,), backend="gloo", timeout_s=90, show_output=False)
    for out in ranks:
        assert out["model"] == out["kit"]
        assert all(o["values"] == s for o, s in zip(out["kit"], out["saved"]))
        assert all(o["files"] == {".metadata": True, "rank files (.distcp)": 2, "other files": 0} for o in out["kit"])
        assert all(o["values"] == s and o["files"] == {".metadata": False, "rank files (.distcp)": 0, "other files": 1}
                   for o, s in zip(out["torch_save_rank0"], out["saved"]))
        assert all(o["values"] != s and o["files"] == k["files"] for o, s, k in zip(out["not_loaded"], out["saved"],
                                                                                    out["kit"]))


def test_the_stub_is_not_attempted_and_launches_nothing(own_tmp):
    def save_and_load(model, fresh, folder):
        """Save with dcp.save, load into fresh with dcp.load."""
        ...  # your code here

    assert ckx.SAVE_AND_LOAD is sx.SAVE_AND_LOAD
    assert judge(save_and_load).status == NOT_ATTEMPTED


def test_a_learner_written_save_and_load_is_correct(own_tmp):
    def mine(model, fresh, folder):
        import torch.distributed.checkpoint as dcp
        dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
        state = {"model": {k: torch.zeros_like(v) for k, v in fresh.state_dict().items()}}
        dcp.load(state, checkpoint_id=folder)
        fresh.load_state_dict(state["model"])

    verdict = judge(mine)
    assert verdict.status == CORRECT and "on 2 live ranks" in verdict.text, verdict.text


def torch_save_rank0(model, fresh, folder):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), folder + "/checkpoint.pt")
    dist.barrier()
    fresh.load_state_dict(torch.load(folder + "/checkpoint.pt"))


def not_loaded(model, fresh, folder):
    import torch.distributed.checkpoint as dcp
    dcp.save(model.state_dict(), checkpoint_id=folder)
    dcp.load(model.state_dict(), checkpoint_id=folder)         # loaded into the wrong model: fresh untouched


@pytest.mark.parametrize("learner", [torch_save_rank0, not_loaded], ids=lambda f: f.__name__)
def test_each_rival_written_as_a_learner_would_is_caught_with_its_own_hint(own_tmp, learner):
    mistake = {"torch_save_rank0": "torch_save_rank0", "not_loaded": "not_loaded"}[learner.__name__]
    hint = {m.name: m.hint for m in sx.SAVE_AND_LOAD.mistakes}[mistake]
    verdict = judge(learner)
    assert verdict.status == WRONG and verdict.mistake == mistake and hint in verdict.text, verdict.text


def test_hostile_answers_each_get_one_line(own_tmp):
    def raises(model, fresh, folder):
        raise RuntimeError("no")

    def exits(model, fresh, folder):
        import os
        os._exit(4)

    said = {f.__name__: judge(f).text for f in (raises, exits)}
    assert "your code raised RuntimeError: no (case 1" in said["raises"]
    assert "process ended while running your code" in said["exits"] and "exit code 4" in said["exits"]
    assert_one_line_each(said, "dcp_save_and_load")


def test_an_answer_that_sleeps_forever_meets_the_timeout_and_leaves_no_file(own_tmp):
    def sleeps(model, fresh, folder):
        import time
        time.sleep(600)

    verdict = judge(sleeps, dataclasses.replace(FAST, case_s=1.0, start_s=15.0))     # 21 s: 6 cases
    assert_timed_out(verdict, 21)


def test_the_notebooks_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    """The stub tagged rank-exercise-stub has the model answer's arguments; the check cell hands it to
    ex.SAVE_AND_LOAD.check."""
    stub = notebook_rank_stub("16_distributed_checkpoints.ipynb", "SAVE_AND_LOAD", sx.save_and_load, tmp_path)
    assert judge(stub).status == NOT_ATTEMPTED
