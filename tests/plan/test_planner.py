"""The planner: collectives on the right link, the bubble, feasibility, ranking and its reason."""
import pytest

from labkit.comm.two_tier import Link
from labkit.plan.planner import enumerate_layouts, group_link, plan, predict, why_it_wins
from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout, ModelSpec

GPT = ModelSpec(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=1000, global_batch=16)
DEV = DeviceSpec("test", 16 * 2**30, 100e12, efficiency=0.5)
TWO_NODES = ClusterSpec(4, 2, intra=Link(1e-6, 1 / 100e9), inter=Link(1e-5, 1 / 1e9))


def test_a_group_inside_a_node_uses_the_fast_link():
    assert group_link(TWO_NODES, 1, 4) is TWO_NODES.intra
    assert group_link(TWO_NODES, 1, 8) is TWO_NODES.inter
    assert group_link(TWO_NODES, 4, 2) is TWO_NODES.inter


def test_tp_across_nodes_costs_more_than_inside():
    inside = predict(GPT, DEV, TWO_NODES, Layout(dp=2, tp=4)).time["TP all-reduces"]
    across = predict(GPT, DEV, TWO_NODES, Layout(dp=1, tp=8)).time["TP all-reduces"]
    assert across > 10 * inside > 0


def test_compute_splits_over_every_rank_and_the_bubble_follows_1f1b():
    p = predict(GPT, DEV, TWO_NODES, Layout(dp=2, pp=4, micro_batch=1))
    assert p.time["compute"] == pytest.approx(GPT.step_flops() / (8 * 100e12 * 0.5))
    m = 16 // 2
    assert p.time["pipeline bubble"] == pytest.approx(3 / m * (p.time["compute"] + p.time["TP all-reduces"]))


def test_every_enumerated_layout_uses_all_ranks_and_divides():
    layouts = enumerate_layouts(GPT, TWO_NODES)
    assert layouts and all(lay.ranks == 8 for lay in layouts)
    assert all(GPT.heads % lay.tp == 0 and GPT.layers % lay.pp == 0 for lay in layouts)


def test_the_plan_ranks_fitting_layouts_first_and_says_why():
    ranked = plan(GPT, DEV, TWO_NODES)
    fits = [p.fits for p in ranked]
    assert fits == sorted(fits, reverse=True)
    first = [p.step_s for p in ranked if p.fits]
    assert first == sorted(first)
    assert ranked[0].layout.label() in why_it_wins(ranked)
    tiny = DeviceSpec("tiny", 1e6, 1e12)
    assert why_it_wins(plan(GPT, tiny, TWO_NODES)).startswith("nothing fits")


def test_an_impossible_layout_gets_one_clear_message():
    with pytest.raises(ValueError, match="heads"):
        predict(GPT, DEV, ClusterSpec(32, 1), Layout(tp=32))


def test_a_space_constrains_every_axis_and_says_what_it_allowed():
    from labkit.plan.planner import Space

    space = Space(pp=(1,), cp=(1,), zero=(0,), micro_batches=(1,), checkpointing=(False,))
    ranked = plan(GPT, DEV, ClusterSpec(8, 1), micro_batches=(1, 2, 4, 8), space=space)
    assert ranked and all(p.layout.pp == p.layout.cp == 1 and p.layout.zero == 0 and not p.layout.checkpointing
                          and p.layout.micro_batches(GPT) == 1 for p in ranked)
    assert len(ranked) < len(plan(GPT, DEV, ClusterSpec(8, 1), micro_batches=(1, 2, 4, 8)))
    assert space.describe().endswith("; tp any")
    with pytest.raises(ValueError, match="within tp in \\(3,\\)"):
        plan(GPT, DEV, ClusterSpec(8, 1), space=Space(tp=(3,)))


def _naive_layouts(model, cluster, micro_batches=(1, 2, 4), max_cp=8):
    """Every divisor of the GPU count on every axis, as the planner did before (slow on a large cluster)."""
    import itertools

    from labkit.plan.specs import layout_problem

    n = cluster.world_size
    divs = [d for d in range(1, n + 1) if n % d == 0]
    out = []
    for tp, pp, cp in itertools.product(divs, repeat=3):
        if n % (tp * pp * cp) or cp > max_cp:
            continue
        for zero, mb, ckpt in itertools.product((0, 1, 2, 3), micro_batches, (False, True)):
            layout = Layout(n // (tp * pp * cp), tp, pp, cp, zero, mb, ckpt)
            if layout_problem(model, cluster, layout) is None:
                out.append(layout)
    return out


@pytest.mark.parametrize("model, cluster", [(GPT, TWO_NODES), (GPT, ClusterSpec(8, 6)),
                                            (ModelSpec(12, 768, 12, 2048, 1000, global_batch=96), ClusterSpec(6, 4))])
def test_the_fast_enumeration_finds_exactly_the_layouts_of_trying_every_divisor(model, cluster):
    assert enumerate_layouts(model, cluster) == _naive_layouts(model, cluster)


def test_a_large_cluster_is_planned_in_well_under_five_seconds():
    """16,384 GPUs must plan in under 5 s, and the largest accepted cluster (a million GPUs) too: trying every
    divisor of the GPU count on three axes took 31 s for a million nodes before reaching 'no layout'."""
    import time

    from labkit.plan.specs import MAX_GPUS

    model = ModelSpec(32, 4096, 32, 4096, 32000, global_batch=1024)
    for nodes in (2048, MAX_GPUS // 8):
        start = time.perf_counter()
        ranked = plan(model, DEV, ClusterSpec(8, nodes), space=None) if nodes == 2048 else \
            enumerate_layouts(model, ClusterSpec(8, nodes))
        took_s = time.perf_counter() - start
        print(f"{8 * nodes:,} GPUs: {len(ranked)} layouts in {took_s:.2f} s")
        assert took_s < 5.0
