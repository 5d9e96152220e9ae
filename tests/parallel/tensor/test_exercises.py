"""Notebook 13's exercises: each reference is right on a hand-worked case and each planted mistake is caught; the
live-rank f/g exercise: the kit's answer (the megatron operators) is the unsplit MLP on 2 and 3 gloo ranks, each
rival differs from it as its hint says, a learner-written pair is correct, each rival is named with its own hint, a
raising answer gets one line and a hanging one meets the timeout."""
import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.answers import FLOAT32_REL_TOL, mismatch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, Exercise
from labkit.parallel.tensor import exercises as tpx
from labkit.parallel.tensor.megatron import COLUMN, ROW, shard_tensor
from tests.exercise_support import assert_caught, assert_one_line_each, assert_sound, assert_timed_out, \
    notebook_rank_stub


def test_shard_weight_takes_rows_for_column_parallel_and_columns_for_row_parallel():
    w = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert tpx.shard_weight_reference(w, "column", 1, 2) == [[5, 6, 7, 8]]
    assert tpx.shard_weight_reference(w, "row", 1, 2) == [[3, 4], [7, 8]]


def test_tp_bytes_is_four_ring_all_reduces_and_the_notebooks_case_comes_first():
    # b*s*h = 2*8*16 = 256 elements x 4 B = 1024 B per all-reduce; a ring of 2 sends 2(t-1)/t = 1x of it; 4 of them
    assert tpx.tp_bytes_reference(2, 8, 16, 2, 4) == 4 * 1024
    cases = tpx.tp_bytes_cases_for(2, 8, 16, 2)
    assert cases[0] == {"batch": 2, "seq_len": 8, "hidden": 16, "world_size": 2, "bytes_per_element": 4}


def test_the_slow_link_carries_the_groups_that_span_the_nodes():
    assert tpx.slow_link_reference("tp_inside", 100.0, 7.0, 2) == 14.0
    assert tpx.slow_link_reference("dp_inside", 100.0, 7.0, 2) == 200.0
    for mistake in tpx.SLOW_LINK.mistakes:
        assert mistake.answer("tp_inside", 100.0, 7.0, 2) != 14.0


EXERCISES = [v for v in vars(tpx).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


# ------------------------------------------------------------------ 13's live-rank exercise: the f/g pair
SEED = 99
FG = dataclasses.replace(tpx.FG_PAIR, case_s=4.0, start_s=20.0)
MISTAKES = {m.name: m for m in tpx.FG_PAIR.mistakes}


def judge(answer, exercise=FG):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def written_pair(f_forward: bool, f_backward: bool, g_forward: bool, g_backward: bool):
    """A learner's tp_mlp written with its own autograd Functions, each all-reduce switched on or off: (False, True,
    True, False) is right, each rival turns one switch."""
    def maybe_reduce(t, on):
        t = t.clone()
        if on:
            dist.all_reduce(t)
        return t

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, forward_on, backward_on):
            ctx.backward_on = backward_on
            return maybe_reduce(t, forward_on)

        @staticmethod
        def backward(ctx, grad):
            return maybe_reduce(grad, ctx.backward_on), None, None

    def tp_mlp(x, w1_shard, w2_shard):
        hidden = F.gelu(Op.apply(x, f_forward, f_backward) @ w1_shard.t())
        return Op.apply(hidden @ w2_shard.t(), g_forward, g_backward)
    return tp_mlp


WRITTEN = {"right": (False, True, True, False), "f_identity": (False, False, True, False),
           "g_identity": (False, True, False, False), "g_reduces_backward": (False, True, True, True),
           "f_reduces_forward": (True, True, True, False), "swapped": (True, False, False, True)}


def unsplit(case: dict, rank: int, world_size: int, x_scale: float = 1.0) -> dict:
    """In one process, no communication: the unsplit MLP on x_scale * x, its output and gradients, the weight
    gradients cut to this rank's shards."""
    t = tpx.mlp_tensors(case["batch"], case["d_model"], case["hidden_per_rank"] * world_size, case["seed"])
    x, w1, w2 = (t[k].clone().requires_grad_() for k in ("x", "w1", "w2"))
    out = F.gelu((x_scale * x) @ w1.t()) @ w2.t()
    (out * t["loss_weights"]).sum().backward()
    return {"output": out.detach(), "x_grad": x.grad, "w1_shard_grad": shard_tensor(w1.grad, COLUMN, rank, world_size),
            "w2_shard_grad": shard_tensor(w2.grad, ROW, rank, world_size)}


def every_answer(cases: list[dict]) -> dict:
    """In a rank: per case, the unsplit MLP's figures (on x and on W x) and every kit and learner-written answer's."""
    rank, w = dist.get_rank(), dist.get_world_size()
    kit = {"expected": tpx.megatron_mlp, "reference": tpx.tp_mlp, **{m.name: m.answer for m in tpx.FG_PAIR.mistakes}}
    written = {f"written_{k}": written_pair(*v) for k, v in WRITTEN.items()}
    out = {name: [tpx.fg_case(fn, **c) for c in cases] for name, fn in {**kit, **written}.items()}
    out["unsplit"] = [{k: v.reshape(-1).tolist() for k, v in unsplit(c, rank, w).items()} for c in cases]
    out["unsplit_wx"] = [{k: v.reshape(-1).tolist() for k, v in unsplit(c, rank, w, float(w)).items()} for c in cases]
    return out


def f64(values):
    return torch.tensor(values, dtype=torch.float64)          # the ranks' float64 figures, kept float64


def close(got, want):
    return all(torch.allclose(f64(got[k]), f64(want[k]), rtol=1e-9, atol=1e-12) for k in want)


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_kit_answer_is_the_unsplit_mlp_and_each_rival_is_what_its_hint_says(own_tmp, world_size):
    cases = tpx.fg_cases() + tpx.fg_cases(seed=SEED)
    ranks = launch(every_answer, world_size, args=(cases,), backend="gloo", timeout_s=90, show_output=False)
    w = world_size
    for i in range(len(cases)):
        per = [{name: r[name][i] for name in r} for r in ranks]
        for p in per:
            assert close(p["expected"], p["unsplit"]) and close(p["reference"], p["expected"])
            grads = {k: v for k, v in p["unsplit"].items() if k != "output"}
            assert not close(p["f_identity"], p["unsplit"])
            assert close(p["f_identity"], {k: v for k, v in p["unsplit"].items() if k != "x_grad"})
            assert close(p["g_identity"], grads) and not close(p["g_identity"], p["unsplit"])
            assert close(p["g_reduces_backward"], {**{k: [w * v for v in g] for k, g in grads.items()},
                                                   "output": p["unsplit"]["output"]})
            assert close(p["f_reduces_forward"], {"output": p["unsplit_wx"]["output"]})
            for name in WRITTEN:             # a learner's own code for each rival gives the kit's rival, to rounding
                assert close(p[f"written_{name}"], p["expected" if name == "right" else name]), name
        # partial sums: without f's backward x's gradient is split over the ranks; without g's forward, the output
        for key, name in (("x_grad", "f_identity"), ("output", "g_identity")):
            assert torch.allclose(sum(f64(p[name][key]) for p in per), f64(per[0]["unsplit"][key]), rtol=1e-9,
                                  atol=1e-12)
        swapped = sum(f64(p["swapped"]["output"]) for p in per)       # g's code before fc1: W x, left unsummed
        assert torch.allclose(swapped, f64(per[0]["unsplit_wx"]["output"]), rtol=1e-9, atol=1e-12)
        # the judge names the first mistake that matches: each rival differs from the answer and the ones before it
        names = ["expected", *MISTAKES]
        for a, first in enumerate(names):
            for second in names[a + 1:]:
                assert any(mismatch(p[second], p[first], FLOAT32_REL_TOL) is not None for p in per), (first, second)


def tp_mlp(x, w1_shard, w2_shard):
    """A learner's right answer, written at the top of a cell: only torch and dist from outside."""
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            dist.all_reduce(grad)
            return grad

    class G(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            dist.all_reduce(partial)
            return partial

        @staticmethod
        def backward(ctx, grad):
            return grad

    return G.apply(torch.nn.functional.gelu(F.apply(x) @ w1_shard.t()) @ w2_shard.t())


def test_a_learner_written_pair_is_correct_and_each_rival_gets_its_own_hint(own_tmp, monkeypatch):
    seen = []
    real_launch = ra.launch

    def spy(*args, **kwargs):
        seen.append(real_launch(*args, **kwargs))
        return seen[-1]
    monkeypatch.setattr(ra, "launch", spy)
    verdict = judge(tp_mlp)
    assert verdict.status == CORRECT and "on 2 live ranks" in verdict.text, verdict.text
    for mistake in tpx.FG_PAIR.mistakes:    # the same ranks' outputs, the answer's replaced by the rival's
        monkeypatch.setattr(ra, "launch", lambda *a, m=mistake, **k: [{**r, "answer": r[m.name]} for r in seen[0]])
        assert_caught(judge(tp_mlp), mistake)


def test_a_live_rival_is_named_and_hostile_answers_get_one_line(own_tmp):
    wrong = judge(g_twice)
    assert_caught(wrong, MISTAKES["g_reduces_backward"])
    said = {"raises": judge(raises_in_backward).text, "outside": judge(uses_a_notebook_name).text}
    assert "your code raised RuntimeError: no (case 1" in said["raises"], said
    assert "cannot run on the ranks: uses_a_notebook_name uses F, defined outside it" in said["outside"], said
    assert_one_line_each({"raises": said["raises"]}, "fg_pair")
    assert len(said["outside"].splitlines()) == 1, said        # refused before any rank starts
    hung = judge(sleeps, dataclasses.replace(FG, case_s=2.0, start_s=20.0))    # 20 + 2 x 4 cases = 28 s
    assert_timed_out(hung, 28)


def g_twice(x, w1_shard, w2_shard):
    """The rival 'g all-reduces in backward too', as a learner writes it."""
    class Both(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            t = t.clone()
            dist.all_reduce(t)
            return t

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    return Both.apply(torch.nn.functional.gelu(Copy.apply(x) @ w1_shard.t()) @ w2_shard.t())


def raises_in_backward(x, w1_shard, w2_shard):
    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("no")

    return Copy.apply(x) @ w1_shard.t() @ w2_shard.t()


def uses_a_notebook_name(x, w1_shard, w2_shard):
    return F.gelu(x @ w1_shard.t()) @ w2_shard.t()


def sleeps(x, w1_shard, w2_shard):
    import time
    time.sleep(600)


def test_the_notebooks_stub_is_not_attempted_and_its_check_cell_judges_it(tmp_path):
    stub = notebook_rank_stub("13_tensor_parallelism.ipynb", "FG_PAIR", tpx.tp_mlp, tmp_path)
    assert judge(stub).status == NOT_ATTEMPTED


def test_the_model_answer_ships_alone_and_the_stub_arguments_are_the_cases():
    assert "class CopyToParallel(torch.autograd.Function)" in ra.answer_source(tpx.tp_mlp)
    assert ra.unfilled(tpx.tp_mlp) is False
    for case in tpx.fg_cases() + tpx.fg_cases(seed=SEED):
        assert set(case) == {"batch", "d_model", "hidden_per_rank", "seed"}
