"""Today's layer shapes counted by hand: GQA's K/V projections, SwiGLU's three matrices, experts and where they sit."""
import pytest

from labkit.plan.shapes import (MoESpec, attention_params, ffn_activation_bytes, ffn_params, moe_ffn_params,
                                norm_params, routed_expert_params)


def test_grouped_query_attention_shrinks_k_and_v_only():
    h, heads = 64, 8
    assert attention_params(h, heads, heads, biases=False) == 4 * h * h          # plain multi-head: 4h^2
    assert attention_params(h, heads, 2, biases=False) == 2 * h * h + 2 * h * (h // heads * 2)
    assert attention_params(h, heads, heads, biases=True) == 4 * h * h + 4 * h


def test_swiglu_has_three_matrices_and_gpt_two():
    assert ffn_params(64, 256, gated=False, biases=False) == 2 * 64 * 256
    assert ffn_params(64, 172, gated=True, biases=False) == 3 * 64 * 172
    assert ffn_params(64, 256, gated=False, biases=True) == 2 * 64 * 256 + 256 + 64       # GPT's 8h^2 + 5h
    assert norm_params(64, biases=True) == 4 * 64 and norm_params(64, biases=False) == 2 * 64
    assert ffn_activation_bytes(8, 1, 256, gated=True) == 2 * ffn_activation_bytes(8, 1, 256, gated=False)


def test_a_mixture_of_experts_counts_every_expert_but_a_token_uses_top_k_and_the_shared():
    moe = MoESpec(experts=8, top_k=2, expert_ffn=100, shared_experts=1)
    one = ffn_params(64, 100, gated=True, biases=False)
    assert moe_ffn_params(64, moe, gated=True, biases=False) == 9 * one + 64 * 8          # + the router h x E
    assert moe_ffn_params(64, moe, gated=True, biases=False, used_only=True) == 3 * one + 64 * 8
    assert routed_expert_params(64, moe, gated=True, biases=False) == 8 * one              # shared ones stay


@pytest.mark.parametrize("moe, layers, want", [(MoESpec(8, 2, 10), 32, 32), (MoESpec(8, 2, 10, every=2), 32, 16),
                                               (MoESpec(256, 8, 10, first_dense=3), 61, 58)])
def test_moe_layers_every_n_th_after_the_dense_ones(moe, layers, want):
    assert moe.moe_layers(layers) == want


@pytest.mark.parametrize("kwargs, match", [(dict(experts=4, top_k=5, expert_ffn=8), "top_k=5 must be at most"),
                                           (dict(experts=4, top_k=1, expert_ffn=8, shared_experts=-1), "shared"),
                                           (dict(experts=0, top_k=1, expert_ffn=8), "experts")])
def test_bad_expert_descriptions_get_one_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MoESpec(**kwargs)
