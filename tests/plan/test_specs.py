"""The planner's inputs and its memory terms: hand-worked numbers, ZeRO's factors, clear errors."""
import pytest

from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout, ModelSpec, layout_problem, memory_terms

GPT = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=100, global_batch=8)
DEV = DeviceSpec("test", 1e9, 1e12, efficiency=0.5)


def test_parameters_and_flops_by_hand():
    assert GPT.layer_params == 12 * 64 ** 2 + 13 * 64
    assert GPT.num_params == 4 * GPT.layer_params + (100 + 32) * 64
    assert GPT.step_flops(True) / GPT.step_flops(False) == pytest.approx(96 / 72)


def test_model_state_follows_zero_and_splits_over_tp_and_pp():
    psi = GPT.num_params
    plain = memory_terms(GPT, DEV, Layout(dp=4))
    assert plain["parameters"] == 2 * psi and plain["optimizer state"] == 12 * psi
    z3 = memory_terms(GPT, DEV, Layout(dp=4, zero=3))
    assert z3["parameters"] == plain["parameters"] / 4 and z3["gradients"] == plain["gradients"] / 4
    z1 = memory_terms(GPT, DEV, Layout(dp=4, zero=1))
    assert z1["gradients"] == plain["gradients"] and z1["optimizer state"] == plain["optimizer state"] / 4
    assert memory_terms(GPT, DEV, Layout(tp=2, pp=2))["parameters"] == plain["parameters"] / 4


def test_activations_shrink_with_checkpointing_tp_and_cp():
    base = memory_terms(GPT, DEV, Layout(dp=1))["activations kept"]
    ckpt = memory_terms(GPT, DEV, Layout(checkpointing=True))
    assert ckpt["activations kept"] == 4 * 2 * 32 * 64 and ckpt["one layer recomputed (backward)"] == base / 4
    assert memory_terms(GPT, DEV, Layout(tp=2))["activations kept"] == pytest.approx(base / 2)
    assert memory_terms(GPT, DEV, Layout(cp=2))["activations kept"] == pytest.approx(base / 2)


def test_layout_problems_are_named():
    cluster = ClusterSpec(4, 1)
    assert layout_problem(GPT, cluster, Layout(dp=4)) is None
    assert "GPUs" in layout_problem(GPT, cluster, Layout(dp=2))
    assert "heads" in layout_problem(GPT, ClusterSpec(8, 1), Layout(tp=8))
    assert "ZeRO" in layout_problem(GPT, ClusterSpec(1, 1), Layout(zero=2))


@pytest.mark.parametrize("kwargs, match", [({"hidden": 65}, "divisible"), ({"layers": 0}, "layers")])
def test_bad_models_get_one_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelSpec(**{**dict(layers=4, hidden=64, heads=4, seq_len=32, vocab=100), **kwargs})


def test_devices_come_from_the_one_peak_table():
    h100 = DeviceSpec.from_table("NVIDIA H100 SXM", 80)
    assert h100.peak_flops_per_s == pytest.approx(989.5e12)
    with pytest.raises(ValueError, match="PEAK_TABLE"):
        DeviceSpec.from_table("Nonexistent GPU", 80)
    with pytest.raises(ValueError, match="zero"):
        Layout(zero=4)


# ---- absurd sizes: one clear line before any arithmetic overflows (issue 53: a 29-line OverflowError traceback)
@pytest.mark.parametrize("kwargs, match", [({"hidden": 10**200}, r"about 1e\+40\d parameters is past"),
                                           ({"vocab": 10**15}, "parameters is past"),
                                           ({"global_batch": 10**20}, "tokens per step is past")])
def test_absurd_model_sizes_are_refused_in_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelSpec(**{**dict(layers=4, hidden=64, heads=4, seq_len=32, vocab=100), **kwargs})


def test_a_cluster_of_a_million_nodes_is_refused_and_a_large_real_one_is_not():
    with pytest.raises(ValueError, match=r"8,000,000 GPUs \(1,000,000 nodes\) is past"):
        ClusterSpec(8, 10**6)
    assert ClusterSpec(8, 2048).world_size == 16384


def test_an_odd_sequence_needs_no_context_parallelism_but_cp_does():
    """Ring attention splits the sequence into 2 x cp chunks: the rule binds only when cp > 1 (2047 was refused)."""
    odd = ModelSpec(layers=4, hidden=64, heads=4, seq_len=2047, vocab=100, global_batch=8)
    assert layout_problem(odd, ClusterSpec(4, 1), Layout(dp=4)) is None
    assert "no multiple of 2 x cp=2" in layout_problem(odd, ClusterSpec(4, 1), Layout(dp=2, cp=2))
