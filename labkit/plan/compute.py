"""The busiest pipeline stage's compute seconds for one layout: every layer's GEMMs at their shape's rate, the
attention blocks, element-wise work and the output logits, forward once, backward twice, the forward again
when recomputed; a mixture of experts runs its k routed and shared experts' GEMMs.

The logits are the last stage's alone, not a share spread over the stages: a pipeline runs at the pace of its
slowest stage, and Megatron-LM builds the output layer and loss only on the last one (``post_process =
mpu.is_pipeline_last_stage()`` in ``megatron/training.py``'s ``get_model``, also under interleaving, on its last
virtual chunk); its later ``--account-for-loss-in-pipeline-split`` exists to rebalance exactly this."""
from __future__ import annotations

from labkit.plan.rates import elementwise_s, layer_forward_s, logits_forward_s
from labkit.plan.shapes import layer_activation_bytes
from labkit.plan.specs import DeviceSpec, Layout, ModelSpec


def compute_terms(model: ModelSpec, device: DeviceSpec, layout: Layout, selective: bool = True) -> tuple:
    """(compute seconds of the busiest stage, one ring step's attention-block forward seconds): every layer's
    GEMMs at their shape's rate, attention, element-wise work and the last stage's logits
    (:mod:`labkit.plan.rates`), forward once, backward twice, the forward again when recomputed."""
    lay, m = layout, layout.micro_batches(model)
    tokens = lay.micro_batch * model.seq_len // lay.cp
    rate = (device.peak_flops_per_s, device.efficiency, device.sms, device.memory_bytes_per_s)
    passes = 4 if lay.checkpointing else 3
    dense_bytes, moe_bytes = layer_activation_bytes(model.seq_len // lay.cp, lay.micro_batch, model.hidden,
                                                    model.heads, model.kv, lay.tp, model.ffn, model.gated_ffn,
                                                    model.moe, selective)
    gemms, block = layer_forward_s(model.hidden, model.heads, model.kv, model.ffn, model.gated_ffn, tokens,
                                   model.seq_len, lay.cp, lay.tp, lay.micro_batch, *rate)
    if model.moe_layers:        # an MoE layer's FFN: k routed + shared experts' GEMMs on the tokens sent to them
        moe = model.moe
        per_expert = layer_forward_s(model.hidden, model.heads, model.kv, moe.expert_ffn, model.gated_ffn, tokens,
                                     model.seq_len, lay.cp, lay.tp, lay.micro_batch, *rate)[0]
        attention_only = layer_forward_s(model.hidden, model.heads, model.kv, 1, False, tokens, model.seq_len,
                                         lay.cp, lay.tp, lay.micro_batch, *rate)[0]
        moe_gemms = attention_only + (moe.top_k + moe.shared_experts) * (per_expert - attention_only)
    else:
        moe_gemms = gemms
    moe_share = model.moe_layers / model.layers
    layer_s = ((1 - moe_share) * (passes * (gemms + lay.cp * block) + elementwise_s(dense_bytes, rate[3],
                                                                                    lay.checkpointing))
               + moe_share * (passes * (moe_gemms + lay.cp * block) + elementwise_s(moe_bytes, rate[3],
                                                                                   lay.checkpointing)))
    logits = 3 * logits_forward_s(model.hidden, model.vocab, tokens, lay.tp, *rate) if model.embedding else 0.0
    # the output layer runs on the last stage only (Megatron-LM builds it where is_pipeline_last_stage()), which
    # keeps its even share of layers, or the smaller share where stages are uneven: the busiest stage sets the pace
    last_stage = model.layers // lay.pp * layer_s + logits
    return m * max(lay.stage_layers(model) * layer_s, last_stage), block
