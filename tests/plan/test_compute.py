"""The busiest stage's compute: the old FLOPs / (peak x efficiency) where a device gives no SMs or bandwidth (the
self-score's measured CPU), and a real price for splitting where it does."""
import pytest

from labkit.plan.compute import compute_terms
from labkit.plan.shapes import MoESpec
from labkit.plan.specs import DeviceSpec, Layout, ModelSpec

GPT = ModelSpec(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=1000, global_batch=16)
PLAIN = DeviceSpec("measured", 16 * 2**30, 100e12, efficiency=0.5)
A100 = DeviceSpec.from_table("NVIDIA A100 SXM", 80)


@pytest.mark.parametrize("layout", [Layout(dp=4), Layout(dp=2, tp=2, checkpointing=True), Layout(cp=4)])
def test_an_undescribed_device_computes_the_step_s_flops_at_its_efficiency(layout):
    compute, _ = compute_terms(GPT, PLAIN, layout)
    want = GPT.step_flops(layout.checkpointing) / (layout.ranks * 100e12 * 0.5)
    assert compute == pytest.approx(want, rel=1e-9)


def test_on_a_listed_gpu_a_finer_split_costs_more_than_its_share():
    """Rival (the issue's): tp 8 runs 1/8 of the unsplit time."""
    small = ModelSpec(layers=4, hidden=2304, heads=24, seq_len=2048, vocab=51200, global_batch=8)
    whole, _ = compute_terms(small, A100, Layout(dp=1))
    split, _ = compute_terms(small, A100, Layout(tp=8))
    assert split * 8 > 1.1 * whole


def test_a_mixture_of_experts_computes_its_active_experts_only():
    moe = ModelSpec(layers=4, hidden=1024, heads=16, seq_len=1024, vocab=1000, global_batch=8, gated_ffn=True,
                    ffn_hidden=2816, moe=MoESpec(experts=8, top_k=2, expert_ffn=1024))
    compute, _ = compute_terms(moe, PLAIN, Layout(dp=2))
    assert compute == pytest.approx(moe.step_flops() / (2 * 100e12 * 0.5), rel=0.02)   # the router is not a GEMM here
