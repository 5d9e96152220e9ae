"""Notebook 14's live-rank exercise: a learner's ring attention loop judged on 3 gloo ranks against the kit's own ring,
which equals full attention in one process; each rival (averaged blocks, W-1 steps, own block twice, never swapped,
no running max) differs from it and from every other, a learner-written rival is caught with its own hint, hostile
answers get one line each."""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from labkit.comm import rank_answers as ra
from labkit.comm.launch import launch
from labkit.core.answers import FLOAT32_REL_TOL, mismatch
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED
from labkit.parallel.context import ring_exercise as rx
from labkit.parallel.context.ring_attention import full_attention
from labkit.plan import exercises as ex
from tests.exercise_support import assert_caught, assert_one_line_each, assert_timed_out, notebook_rank_stub

SEED = 99
FAST = dataclasses.replace(rx.RING_ATTENTION, case_s=4.0, start_s=25.0)
MISTAKES = {m.name: m for m in rx.RING_ATTENTION.mistakes}


def judge(answer, exercise=FAST):
    return ra.judge_on_ranks(exercise, answer, seed=SEED)


def every_answer(cases: list[dict]) -> dict:
    """In a rank: per answer (the model, the kit's expected, each mistake), its output on every case."""
    names = {"model": rx.ring_attention, "kit": rx.kit_ring_attention, **{n: m.answer for n, m in MISTAKES.items()}}
    return {name: [rx.ring_case(fn, **c) for c in cases] for name, fn in names.items()}


def one_process(heads: int, tokens: int, head_dim: int, score_scale: float, seed: int) -> list[list]:
    """Full attention over the case's whole sequence in this process (float64), cut into the ranks' rows."""
    gen, shape = torch.Generator().manual_seed(seed), (1, heads, tokens * rx.WORLD_SIZE, head_dim)
    q, k = (torch.randn(shape, generator=gen) * score_scale for _ in range(2))
    v = 1 + torch.rand(shape, generator=gen)
    out = full_attention(q.double(), k.double(), v.double(), causal=False)
    return [out[..., r * tokens:(r + 1) * tokens, :].tolist() for r in range(rx.WORLD_SIZE)]


def same(a: list, b: list) -> bool:
    return mismatch(a, b, FLOAT32_REL_TOL) is None


def test_the_kits_ring_equals_full_attention_and_each_rival_differs_from_it_and_the_others(own_tmp):
    cases = rx.ring_cases() + rx.ring_cases(seed=SEED)
    ranks = launch(every_answer, rx.WORLD_SIZE, args=(cases,), backend="gloo", timeout_s=120, show_output=False)
    out = {name: [[r[name][i] for r in ranks] for i in range(len(cases))] for name in ranks[0]}   # case, rank
    full = [one_process(**c) for c in cases]
    assert same(out["kit"], full) and same(out["model"], full)
    names = list(MISTAKES)
    for j, name in enumerate(names):
        assert not same(out[name], out["kit"]), f"{name} passes as right"
        earlier = [n for n in names[:j] if same(out[name], out[n])]
        assert not earlier, f"the judge would name {earlier[0]} for {name}"
    large = [c["score_scale"] == rx.LARGE_SCORE_SCALE for c in cases]
    for got, want, is_large in zip(out["no_running_max"], out["kit"], large):   # the rival shows only at large scores
        has_nan = any(math.isnan(x) for rank in got for x in torch.tensor(rank).flatten().tolist())
        assert has_nan if is_large else (same(got, want) and not has_nan)


def test_each_hint_names_its_rival_and_every_mistake_ships_to_the_ranks_by_name():
    assert all("the rival '" in m.hint for m in MISTAKES.values()), [m.hint for m in MISTAKES.values()]
    assert all(ra._name(m.answer).startswith("labkit.parallel.context.ring_exercise:") for m in MISTAKES.values())
    assert len({m.hint for m in MISTAKES.values()}) == len(MISTAKES) == 5


def test_the_stub_is_not_attempted_and_the_notebooks_check_cell_judges_it(tmp_path):
    assert ex.RING_ATTENTION is rx.RING_ATTENTION
    assert "def ring_attention(q: torch.Tensor" in ra.answer_source(rx.ring_attention)     # the model answer ships as is
    stub = notebook_rank_stub("14_which_parallelism.ipynb", "RING_ATTENTION", rx.ring_attention, tmp_path)
    assert judge(stub).status == NOT_ATTEMPTED


def test_a_learner_written_ring_with_ordered_send_and_recv_is_correct(own_tmp):
    def mine(q, k, v):
        import math
        rank, world = dist.get_rank(), dist.get_world_size()
        acc, m, s = torch.zeros_like(q), None, None
        for step in range(world):
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            block_max = scores.max(dim=-1, keepdim=True).values
            new_m = block_max if m is None else torch.maximum(m, block_max)
            p = torch.exp(scores - new_m)
            if m is not None:
                acc, s = acc * torch.exp(m - new_m), s * torch.exp(m - new_m)
            acc, s, m = acc + p @ v, (0 if s is None else s) + p.sum(-1, keepdim=True), new_m
            if step == world - 1:
                break
            kv, got = torch.cat([k, v], dim=-1), torch.empty(*k.shape[:-1], 2 * k.shape[-1])
            if rank % 2 == 0:                      # even ranks send first, odd ranks receive first: no deadlock
                dist.send(kv, (rank + 1) % world)
                dist.recv(got, (rank - 1) % world)
            else:
                dist.recv(got, (rank - 1) % world)
                dist.send(kv, (rank + 1) % world)
            k, v = got[..., :k.shape[-1]], got[..., k.shape[-1]:]
        return acc / s

    verdict = judge(mine)
    assert verdict.status == CORRECT and f"on {rx.WORLD_SIZE} live ranks" in verdict.text, verdict.text


def test_a_learner_written_softmax_per_block_without_the_running_max_gets_its_hint(own_tmp):
    def per_block(q, k, v):
        out, total = 0, 0
        for step in range(dist.get_world_size()):
            scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
            block_sum = torch.exp(scores).sum(-1, keepdim=True)          # no max: overflows past 88.7
            out, total = out + torch.softmax(scores, dim=-1) @ v * block_sum, total + block_sum
            ops = [dist.P2POp(dist.isend, torch.stack([k, v]), (dist.get_rank() + 1) % dist.get_world_size()),
                   dist.P2POp(dist.irecv, kv := torch.empty(2, *k.shape), (dist.get_rank() - 1) % dist.get_world_size())]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            k, v = kv[0], kv[1]
        return out / total

    assert_caught(judge(per_block), MISTAKES["no_running_max"])


def test_hostile_answers_each_get_one_line(own_tmp):
    def raises(q, k, v):
        raise RuntimeError("no")

    said = {"raises": judge(raises).text}
    assert "your code raised RuntimeError: no (case 1" in said["raises"]
    assert_one_line_each(said, "ring_attention")


def test_a_ring_where_every_rank_receives_first_meets_the_timeout(own_tmp):
    def receives_first(q, k, v):
        got = torch.empty_like(k)
        dist.recv(got, (dist.get_rank() - 1) % dist.get_world_size())    # every rank waits: nobody sends
        return q

    verdict = judge(receives_first, dataclasses.replace(FAST, case_s=1.0, start_s=15.0))   # 21 s: 6 cases
    assert_timed_out(verdict, 21)
