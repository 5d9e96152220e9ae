"""Notebook 05's live-rank exercise: a learner's two-stage forward with send/recv judged on 2 gloo ranks against the
unsplit model run in one process, each rival caught with its own hint, hostile answers given one line each; and the
page's send/recv example run from a cell's source."""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import re
import tempfile
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, ExerciseBook
from labkit.parallel.pipeline import exercises as pex
from labkit.parallel.pipeline import stage_exercise as sx
from labkit.parallel.pipeline.model_parallel import SplitConfig, build_stages

SEED = 99
FAST = dataclasses.replace(sx.PIPELINE_FORWARD, case_s=4.0, start_s=20.0)


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """After the test: nothing named labkit-* left in a private temp folder, no child process."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    assert not list(tmp_path.glob("labkit-*")), list(tmp_path.iterdir())
    assert not psutil.Process().children(recursive=True)


def judge(answer, exercise=FAST):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def both_answers(cases: list[dict]) -> list[list | None]:
    """In a rank: per case, the model answer's output and the kit's expected (unsplit) output."""
    return [[sx.stage_case(sx.pipeline_forward, **c), sx.stage_case(sx.unsplit_forward, **c)] for c in cases]


def one_process(width: int, layers_per_stage: int, batch: int, seed: int) -> list:
    """The unsplit model on the case's batch, in this test's own process."""
    cfg = SplitConfig(in_features=width, hidden=width, layers_per_stage=layers_per_stage, stages=2, seed=seed)
    whole = torch.nn.Sequential(*build_stages(cfg))
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        return whole(x).tolist()


def test_the_model_answer_and_the_kits_expected_equal_one_process_bit_for_bit(own_tmp):
    cases = sx.stage_cases() + sx.stage_cases(seed=SEED)
    ranks = launch(both_answers, 2, args=(cases,), backend="gloo", timeout_s=90, show_output=False)
    assert all(out == [None, None] for out in ranks[0])                      # rank 0 hands on, returns nothing
    assert ranks[1] == [[one_process(**c)] * 2 for c in cases]


def test_a_learner_written_forward_is_correct(own_tmp):
    def my_forward(stage, x):
        if dist.get_rank() == 0:
            dist.send(stage(x).contiguous(), dst=1)
            return None
        buf = torch.zeros(x.shape, dtype=x.dtype)
        dist.recv(buf, src=0)
        return stage(buf)

    verdict = judge(my_forward)
    assert verdict.status == CORRECT and "on 2 live ranks" in verdict.text, verdict.text


@pytest.mark.parametrize("mistake", ["no_split", "own_input"])
def test_each_rival_is_caught_with_its_own_hint(own_tmp, mistake):
    wrong = {m.name: m for m in sx.PIPELINE_FORWARD.mistakes}[mistake]
    verdict = judge(wrong.answer)
    assert verdict.status == WRONG and verdict.mistake == mistake and wrong.hint in verdict.text, verdict.text


def test_hostile_answers_each_get_one_line(own_tmp):
    def raises(stage, x):
        raise RuntimeError("no")

    def exits(stage, x):
        import os
        os._exit(4)

    def returns_a_list(stage, x):
        return [1.0]

    said = {f.__name__: judge(f).text for f in (raises, exits, returns_a_list)}
    assert "your code raised RuntimeError: no (case 1" in said["raises"]
    assert "process ended while running your code" in said["exits"] and "exit code 4" in said["exits"]
    assert "your code raised TypeError: pipeline_forward returned list on rank" in said["returns_a_list"]
    assert all(len(text.splitlines()) == 1 and text.startswith("[pipeline_forward] wrong") for text in said.values())


def test_an_answer_that_never_sends_meets_the_timeout(own_tmp):
    def receives_only(stage, x):
        buf = torch.empty_like(x)
        dist.recv(buf, src=1 - dist.get_rank())            # both ranks wait for a message nobody sends
        return stage(buf)

    one_case = dataclasses.replace(FAST, cases=lambda seed=0: sx.stage_cases(seed)[:1], case_s=2.0, start_s=15.0)
    verdict = judge(receives_only, one_case)                # 2 cases: 15 + 2 x 2 = 19 s
    assert verdict.status == WRONG and "within 19 s, the launcher's timeout" in verdict.text, verdict.text
    assert len(verdict.text.splitlines()) == 1 and "every rank was killed" in verdict.text


def test_on_ranks_runs_a_cells_send_and_recv_and_refuses_outside_names(own_tmp):
    def hand_over(n):
        t = torch.arange(n, dtype=torch.float32) if dist.get_rank() == 0 else torch.zeros(n)
        if dist.get_rank() == 0:
            dist.send(t, dst=1)
        else:
            dist.recv(t, src=0)
        return t.tolist()

    assert sx.on_ranks(hand_over, n=3, timeout_s=60) == [[0.0, 1.0, 2.0]] * 2

    def uses_outside(n):
        return SEED + n

    with pytest.raises(ra.AnswerNotShippable, match="uses SEED"):
        sx.on_ranks(uses_outside, n=1)


def test_the_notebooks_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    """The shipped stub (tagged rank-exercise-stub) reads 'not attempted yet' and has the model answer's arguments;
    the check cell (rank-exercise-check) hands that stub to ex.PIPELINE_FORWARD.check."""
    assert pex.PIPELINE_FORWARD is sx.PIPELINE_FORWARD
    nb = json.loads((Path(__file__).resolve().parents[3] / "notebooks" /
                     "05_model_vs_data_parallelism.ipynb").read_text())
    cells = {tag: ["".join(c["source"]) for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
             for tag in ("rank-exercise-stub", "rank-exercise-check")}
    assert len(cells["rank-exercise-stub"]) == len(cells["rank-exercise-check"]) == 1
    (tmp_path / "stub.py").write_text(cells["rank-exercise-stub"][0])       # a file, so its source can be read
    spec = importlib.util.spec_from_file_location("notebook_stub", tmp_path / "stub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = re.search(r"ex\.PIPELINE_FORWARD\.check\(book,\s*(\w+)\)", cells["rank-exercise-check"][0]).group(1)
    stub = getattr(module, name)
    assert list(inspect.signature(stub).parameters) == list(inspect.signature(sx.pipeline_forward).parameters)
    assert judge(stub).status == NOT_ATTEMPTED


def test_reveal_prints_the_model_answers_send_and_recv(capsys):
    ExerciseBook("05_model_vs_data_parallelism").reveal(pex.PIPELINE_FORWARD)
    shown = capsys.readouterr().out
    assert "[pipeline_forward]" in shown and "dist.send(stage(x), dst=1)" in shown and "dist.recv(" in shown
