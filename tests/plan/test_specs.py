"""The planner's inputs and its memory terms: hand-worked numbers, ZeRO's factors, clear errors."""
import pytest

from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout, ModelSpec, layout_problem, memory_terms

GPT = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=100, global_batch=8)
DEV = DeviceSpec("test", 1e9, 1e12, efficiency=0.5)


def test_parameters_and_flops_by_hand():
    assert GPT.layer_params == 12 * 64 ** 2 + 13 * 64
    assert GPT.num_params == 4 * GPT.layer_params + (100 + 32) * 64
    # Narayanan et al.'s Eq. 3: 96 B s L h^2 (1 + s/6h + V/16Lh) recomputed - the logits are not recomputed
    # (rival: 96/72 of the whole, the logits counted four times)
    b, s, n, h, v = GPT.global_batch, GPT.seq_len, GPT.layers, GPT.hidden, GPT.vocab
    eq3 = 96 * b * s * n * h ** 2 * (1 + s / (6 * h) + v / (16 * n * h))
    assert abs(GPT.step_flops(True) - eq3) / eq3 < 1e-12
    assert GPT.step_flops(True) / GPT.step_flops(False) < 96 / 72


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
    assert "must be divisible by 2*cp=4 (zig-zag causal split)" in layout_problem(odd, ClusterSpec(4, 1),
                                                                                   Layout(dp=2, cp=2))
    # the rules are the mesh's (labkit.comm.mesh): sequence parallelism under tp > 1 splits the sequence too
    assert "tp=2 (sequence parallelism)" in layout_problem(odd, ClusterSpec(4, 1), Layout(dp=2, tp=2))


# ---- today's shapes: GQA, SwiGLU, untied embeddings, a mixture of experts (issues 54 and 55) -------------------
from labkit.plan.shapes import MoESpec  # noqa: E402

LLAMA_LIKE = dict(layers=4, hidden=64, heads=8, seq_len=32, vocab=100, global_batch=8, gated_ffn=True,
                  tied_embeddings=False, learned_positions=False, biases=False, ffn_hidden=172)
MOE = ModelSpec(**LLAMA_LIKE, moe=MoESpec(experts=8, top_k=2, expert_ffn=96, shared_experts=1))


def test_gqa_shrinks_k_v_parameters_and_activations_by_heads_over_kv_heads():
    mha, gqa = ModelSpec(**LLAMA_LIKE), ModelSpec(**LLAMA_LIKE, kv_heads=2)
    h = 64
    assert mha.layer_params - gqa.layer_params == 2 * h * (h - h // 8 * 2)             # K and V: h x h -> h x h/4
    lay = Layout(dp=1)
    drop = memory_terms(mha, DEV, lay)["activations kept"] - memory_terms(gqa, DEV, lay)["activations kept"]
    assert drop == pytest.approx(4 * 32 * 1 * h * (1 - 2 / 8) * 4)                    # K, V (2 bytes each) x 4 layers


def test_swiglu_untied_embeddings_and_rmsnorm_count_by_hand():
    m = ModelSpec(**LLAMA_LIKE)
    assert m.layer_params == 4 * 64 * 64 + 3 * 64 * 172 + 2 * 64
    assert m.num_params == 4 * m.layer_params + 2 * 100 * 64 + 64                      # two embeddings, final norm
    tied = ModelSpec(**{**LLAMA_LIKE, "tied_embeddings": True})
    assert m.num_params - tied.num_params == 100 * 64                                  # the output copy counted


def test_the_gpt_defaults_keep_narayanans_flops_and_korthikantis_bytes():
    assert GPT.step_flops() == pytest.approx(72 * 8 * 32 * 4 * 64 ** 2 * (1 + 32 / (6 * 64) + 100 / (12 * 4 * 64)))


def test_step_flops_count_the_active_experts_not_all_of_them():
    """Rival: FLOPs from the total parameters (every expert on every token)."""
    m, tokens = MOE, 8 * 32
    per_layer = 4 * 64 * 64 + (2 + 1) * 3 * 64 * 96 + 64 * 8                          # attention, 2+1 experts, router
    want = 3 * 2 * tokens * (4 * per_layer + 100 * 64) + 3 * 4 * 8 * 32 ** 2 * 64 * 4
    assert m.step_flops() == pytest.approx(want)
    assert m.num_params > 2 * m.active_params                                          # the rival is far off
    assert m.step_flops() < 0.6 * (6 * tokens * m.num_params)


def test_expert_parameters_and_their_optimizer_state_divide_by_ep():
    """Rival: expert memory does not shrink with ep (experts replicated like the dense weights)."""
    one, four = memory_terms(MOE, DEV, Layout(dp=4, zero=1)), memory_terms(MOE, DEV, Layout(dp=4, zero=1, ep=4))
    experts = MOE.expert_params
    assert one["parameters"] - four["parameters"] == pytest.approx(2 * experts * (1 - 1 / 4))
    # ZeRO-1: the dense optimizer state over dp=4; the experts' over the dp x cp / ep = 1 ranks holding them
    dense = MOE.num_params - experts
    assert one["optimizer state"] == pytest.approx(12 * (dense + experts) / 4)
    assert four["optimizer state"] == pytest.approx(12 * (dense / 4 + experts / 4))


def test_the_mesh_rules_bind_kv_heads_experts_and_ep():
    gqa = ModelSpec(**LLAMA_LIKE, kv_heads=2)
    assert "kv_heads=2 must be divisible by tp=4" in layout_problem(gqa, ClusterSpec(4, 1), Layout(tp=4))
    assert "dense" in layout_problem(GPT, ClusterSpec(4, 1), Layout(dp=4, ep=2))
    with pytest.raises(ValueError, match="must divide dp \\* cp"):     # the mesh's rule, checked when the layout is made
        Layout(dp=4, ep=8)
    odd = ModelSpec(**LLAMA_LIKE, moe=MoESpec(experts=6, top_k=2, expert_ffn=96))
    assert "experts=6 must be divisible by ep=4" in layout_problem(odd, ClusterSpec(4, 1), Layout(dp=4, ep=4))
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=8"):
        ModelSpec(**LLAMA_LIKE, kv_heads=3)


def test_a_layouts_degrees_are_checked_once_by_its_mesh_and_trusted_after(monkeypatch):
    """Issue 50: the tp degree's walk from the planner's layout to the runner's groups validates it once. The layout
    makes its Mesh (which checks every degree) when it is made; the planner's rules and the runner's groups use that
    mesh and check no degree again."""
    from labkit.comm import mesh as mesh_module

    made = []
    real_init = mesh_module.Mesh.__post_init__
    monkeypatch.setattr(mesh_module.Mesh, "__post_init__", lambda self: (made.append(self), real_init(self))[1])
    layout = Layout(dp=2, tp=2)
    assert len(made) == 1 and layout.mesh is made[0]
    assert layout_problem(GPT, ClusterSpec(4, 1), layout) is None and layout.mesh.members("tp") == [[0, 1], [2, 3]]
    assert len(made) == 1                                          # no second check on the way
    with pytest.raises(ValueError, match="tp must be"):
        Layout(tp=0)
