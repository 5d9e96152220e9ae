"""Notebooks 05's and 05b's live-rank exercises. 05: a learner's two-stage forward with send/recv judged on 2 gloo
ranks against the unsplit model run in one process, each rival caught with its own hint, hostile answers given one
line each; and the page's send/recv example run from a cell's source. 05b: a learner's 1F1B training step judged on 3
gloo ranks by its gradients (the unsplit model's, within float32 rounding) and its order (torch's Schedule1F1B's),
the rivals GPipe's order, the loss not divided by m and no accumulation each caught with its own hint, a loop that
never sends the gradient back meeting the timeout."""
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
from labkit.core.answers import FLOAT32_REL_TOL, mismatch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, ExerciseBook
from labkit.parallel.pipeline import exercises as pex
from labkit.parallel.pipeline import stage_exercise as sx
from labkit.parallel.pipeline.model_parallel import SplitConfig, build_stages
from labkit.parallel.pipeline.schedule_sim import one_f_one_b_order
from tests.exercise_support import assert_caught, assert_timed_out, notebook_rank_stub

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


# ------------------------------------------------------------------------------------ 05b: the 1F1B loop
STEP = dataclasses.replace(sx.ONE_F_ONE_B_STEP, case_s=4.0, start_s=25.0)
TWO_CASES = dataclasses.replace(STEP, cases=lambda seed=52: sx.step_cases(seed)[:2])   # p = 2, m > p; p = m = 3
KIT_STEPS = (sx.one_f_one_b_step, sx.one_process_step, *(m.answer for m in sx.ONE_F_ONE_B_STEP.mistakes))


def every_kit_step(cases: list[dict]) -> list[list[dict | None]]:
    """In a rank: per case, the output of the model answer, the expected answer and each mistake, in that order."""
    return [[sx.step_case(answer, **c) for answer in KIT_STEPS] for c in cases]


def one_process_grads(width: int, batch: int, stages: int, micro_batches: int, seed: int) -> list[list[float]]:
    """Per stage, the unsplit model's gradients after one step of the whole batch's mean loss, in this process."""
    cfg = SplitConfig(in_features=width, hidden=width, layers_per_stage=1, num_classes=4, stages=stages, seed=seed)
    parts = build_stages(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = [torch.randn(batch, width, generator=gen) for _ in range(micro_batches)]
    targets = [torch.randn(batch, 4, generator=gen) for _ in range(micro_batches)]
    whole = torch.nn.Sequential(*parts)
    loss = sum(torch.nn.functional.mse_loss(whole(x), y) for x, y in zip(inputs, targets)) / micro_batches
    loss.backward()
    return [torch.cat([p.grad.reshape(-1) for p in part.parameters()]).tolist() for part in parts]


def test_the_1f1b_answers_equal_one_process_in_torchs_order_and_each_rival_differs(own_tmp):
    cases = sx.step_cases() + sx.step_cases(seed=SEED)
    assert {(c["stages"], c["micro_batches"] > c["stages"]) for c in cases} == {(2, True), (3, True), (3, False)}
    ranks = launch(every_kit_step, 3, args=(cases,), backend="gloo", timeout_s=120, show_output=False)
    for i, case in enumerate(cases):
        p, m = case["stages"], case["micro_batches"]
        want = one_process_grads(**case)
        for r in range(3):
            ref, exp, gpipe, summed, last = ranks[r][i]
            if r >= p:                                              # a 2-stage case leaves rank 2 out
                assert ranks[r][i] == [None] * 5
                continue
            assert ref == exp                                       # the distributed answer, bit for bit
            torch.testing.assert_close(torch.tensor(exp["grads"]), torch.tensor(want[r]), rtol=1e-5, atol=1e-7)
            assert exp["order"].split() == one_f_one_b_order(p, r, m) and exp["in flight"] == min(p - r, m)
            assert gpipe["grads"] == exp["grads"] and gpipe["in flight"] == m          # right gradients, GPipe's order
            torch.testing.assert_close(torch.tensor(summed["grads"]), m * torch.tensor(exp["grads"]))
            assert summed["order"] == exp["order"] and last["order"] == exp["order"]
        outputs = [[ranks[r][i][k] for r in range(p)] for k in range(1, 5)]            # expected, then each rival
        for a in range(4):                                          # the judge tells each rival from every other
            for b in range(a + 1, 4):
                assert mismatch(outputs[a], outputs[b], FLOAT32_REL_TOL) is not None, (case, a, b)


def learner_variant(tmp_path: Path, old: str, new: str):
    """The model answer's source with ``old`` replaced by ``new``, loaded from a file as a notebook cell would be."""
    source = inspect.getsource(sx.one_f_one_b_step)
    assert source.count(old) == 1, old
    (tmp_path / "variant.py").write_text(ra.PREAMBLE + source.replace(old, new))
    spec = importlib.util.spec_from_file_location("learner_variant", tmp_path / "variant.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.one_f_one_b_step


def test_a_learner_written_1f1b_loop_is_correct(own_tmp):
    def my_step(stage, stage_index, num_stages, inputs, targets):
        r, p, m = stage_index, num_stages, len(inputs)
        plan, f = [("F", i) for i in range(min(p - r, m))], min(p - r, m)   # p - r forwards fill the pipe
        for b in range(m):
            plan.append(("B", b))
            if f < m:
                plan.append(("F", f))
                f += 1
        saved, pending = {}, []
        for kind, i in plan:
            if kind == "F":
                x = inputs[i] if r == 0 else torch.zeros(inputs[i].shape, requires_grad=False)
                if r > 0:
                    dist.recv(x, src=r - 1)
                    x.requires_grad = True
                y = stage(x)
                if r + 1 < p:
                    pending.append(dist.isend(y.detach().clone(), dst=r + 1))
                saved[i] = (x, y)
                continue
            x, y = saved.pop(i)
            if r + 1 == p:
                torch.autograd.backward(torch.nn.functional.mse_loss(y, targets[i]) / m)
            else:
                g = torch.zeros(y.shape)
                dist.recv(g, src=r + 1)
                torch.autograd.backward(y, g)
            if r > 0:
                pending.append(dist.isend(x.grad, dst=r - 1))
        for work in pending:
            work.wait()

    verdict = judge(my_step, STEP)
    assert verdict.status == CORRECT and "on 3 live ranks" in verdict.text, verdict.text


@pytest.mark.parametrize("mistake, old, new", [
    ("gpipe", "warmup = min(p - 1 - r, m)", "warmup = m"),                   # every forward, then every backward
    ("loss_not_over_m", "targets[i]) / m).backward()", "targets[i])).backward()"),
    ("not_accumulated", "x, out = held.pop(i)", "stage.zero_grad(); x, out = held.pop(i)")])
def test_each_1f1b_rival_written_by_a_learner_is_caught_with_its_own_hint(own_tmp, mistake, old, new):
    wrong = {m.name: m for m in sx.ONE_F_ONE_B_STEP.mistakes}[mistake]
    assert_caught(judge(learner_variant(own_tmp, old, new), TWO_CASES), wrong)


def test_a_1f1b_loop_that_never_sends_the_gradient_back_meets_the_timeout(own_tmp):
    forgets = learner_variant(own_tmp, "sends.append(dist.isend(x.grad, dst=r - 1))", "pass")
    one_case = dataclasses.replace(STEP, cases=lambda seed=52: sx.step_cases(seed)[:1], case_s=2.0, start_s=20.0)
    assert_timed_out(judge(forgets, one_case), 24)          # 2 cases: 20 + 2 x 2 = 24 s


def test_a_raising_1f1b_loop_gets_one_line(own_tmp):
    def raises(stage, stage_index, num_stages, inputs, targets):
        raise RuntimeError("no")

    text = judge(raises, TWO_CASES).text                   # rank 2 sits case 1 out: whichever rank failed first
    assert re.search(r"your code raised RuntimeError: no \(case [12], rank [012]\)$", text), text
    assert len(text.splitlines()) == 1 and text.startswith("[one_f_one_b_step] wrong")


def test_05bs_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    """05b's stub reads 'not attempted yet' (no launch) and the task above it points at torch's Schedule1F1B."""
    assert pex.ONE_F_ONE_B_STEP is sx.ONE_F_ONE_B_STEP
    stub = notebook_rank_stub("05b_pipeline_schedules.ipynb", "ONE_F_ONE_B_STEP", sx.one_f_one_b_step, tmp_path)
    assert judge(stub, STEP).status == NOT_ATTEMPTED
    cells = json.loads((Path(__file__).resolve().parents[3] / "notebooks" / "05b_pipeline_schedules.ipynb")
                       .read_text())["cells"]
    at = next(i for i, c in enumerate(cells) if "rank-exercise-stub" in c.get("metadata", {}).get("tags", []))
    assert "Schedule1F1B" in "".join(cells[at - 1]["source"])


def test_reveal_prints_the_1f1b_model_answer(capsys):
    ExerciseBook("05b_pipeline_schedules").reveal(pex.ONE_F_ONE_B_STEP)
    shown = capsys.readouterr().out
    assert "[one_f_one_b_step]" in shown and "dist.isend(" in shown and "warmup = min(p - 1 - r, m)" in shown
