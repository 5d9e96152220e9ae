"""The planner's memory at scale, against the paper it is built on: Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (arXiv:2205.05198).

Two kinds of check. (1) Their closed forms, recomputed here independently of the planner's term-by-term sum: the
first pipeline stage keeps sbhL/t (34 + 5as/h) bytes with tensor + sequence parallelism under 1F1B (Section 4.2.3,
Eq. 5), 34 sbhL/t with selective recomputation (Eq. 6), 2sbhL/t with full recomputation (Table 2, last row; the
planner adds the one layer recomputed in backward). (2) Their reported figures, where traced: Section 5 says
selective recomputation saves 70% of the activation memory for GPT-3 (a=96, s=2048, h=12288: 5as/h = 80) and 65%
for MT-NLG (a=128, s=2048, h=20480: 5as/h = 64). The 7B- and 70B-class shapes below are shapes given here (layers,
hidden, heads), not figures from a paper.

Today's shapes (GQA, SwiGLU, untied embeddings, mixtures of experts) are held against their published parameter
counts (:func:`parameter_rows`), and the planner's ep axis against DeepSeek-V3's published training layout
(:func:`published_run_rank`): it must fit and be in the list; where it ranks is reported, nothing is fitted to it.
"""
from __future__ import annotations

from dataclasses import replace

from labkit.comm.two_tier import Link
from labkit.plan.planner import Prediction
from labkit.plan.shapes import MoESpec
from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout, ModelSpec, memory_terms

KORTHIKANTI = "Korthikanti et al. 2022, arXiv:2205.05198"
# (name, heads, seq_len, hidden, published saving of selective recomputation, where)
SELECTIVE_SAVINGS = (("GPT-3 175B", 96, 2048, 12288, 0.70, f"{KORTHIKANTI}, Section 5"),
                     ("MT-NLG 530B", 128, 2048, 20480, 0.65, f"{KORTHIKANTI}, Section 5"))
SHAPES = {"7B-class": ModelSpec(32, 4096, 32, 4096, 32000, global_batch=64, name="7B-class"),
          "70B-class": ModelSpec(80, 8192, 64, 4096, 32000, global_batch=64, name="70B-class")}


def eq5_first_stage_bytes(model: ModelSpec, layout: Layout, selective: bool = False) -> float:
    """Eq. 5 (Eq. 6 when selective): activations on the first pipeline stage, tensor + sequence parallel, 1F1B."""
    s, b, h, a, t = model.seq_len // layout.cp, layout.micro_batch, model.hidden, model.heads, layout.tp
    per_sbh = 34 + (0 if selective else 5 * a * s / h)
    return s * b * h * model.layers / t * per_sbh


def selective_saving_rows(device: DeviceSpec | None = None) -> list[dict]:
    """Per published model: the planner's saving from selective recomputation beside the paper's figure."""
    device = device or DeviceSpec("any", 80 * 2**30, 1e15)
    rows = []
    for name, heads, seq, hidden, published, source in SELECTIVE_SAVINGS:
        model = ModelSpec(1, hidden, heads, seq, 51200, global_batch=1, name=name)
        full = memory_terms(model, device, Layout(), selective=False)["activations kept"]
        sel = memory_terms(model, device, Layout(), selective=True)["activations kept"]
        rows.append({"model": name, "planner saving": 1 - sel / full, "published saving": published,
                     "difference (points)": 100 * (1 - sel / full - published), "source": source})
    return rows


def closed_form_rows(device: DeviceSpec, layouts: dict[str, Layout]) -> list[dict]:
    """Per shape and layout: the planner's activations (GiB per rank) beside Eq. 5 / Eq. 6, and the model state."""
    rows = []
    for (shape, model), (label, layout) in ((s, lay) for s in SHAPES.items() for lay in layouts.items()):
        if layout.micro_batches(model) < layout.pp:
            model = replace(model, global_batch=layout.dp * layout.micro_batch * layout.pp)
        for selective in (False, True):
            terms = memory_terms(model, device, layout, selective=selective)
            rows.append({"model": shape, "layout": label, "selective": selective,
                         "planner activations GiB": terms["activations kept"] / 2**30,
                         "Eq. 5/6 GiB": eq5_first_stage_bytes(model, layout, selective) / 2**30,
                         "model state GiB": (terms["parameters"] + terms["gradients"] + terms["optimizer state"])
                         / 2**30, "source": f"{KORTHIKANTI}, Eq. {6 if selective else 5}"})
    return rows


# ---- today's shapes against their published parameter counts, and a published MoE training run ---------------
_LLAMA = dict(gated_ffn=True, tied_embeddings=False, learned_positions=False, biases=False)   # RMSNorm, RoPE, untied
_DSV3 = "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv:2412.19437"
TODAYS_SHAPES = {
    # Llama 3 (Dubey et al. 2024, arXiv:2407.21783, Table 3; vocabulary 128,256 and FFN sizes from Meta's configs)
    "Llama 3 8B": ModelSpec(32, 4096, 32, 8192, 128256, global_batch=64, name="Llama 3 8B", kv_heads=8,
                            ffn_hidden=14336, **_LLAMA),
    "Llama 3 70B": ModelSpec(80, 8192, 64, 8192, 128256, global_batch=64, name="Llama 3 70B", kv_heads=8,
                             ffn_hidden=28672, **_LLAMA),
    # Mixtral (Jiang et al. 2024, arXiv:2401.04088): Mistral 7B's layer with 8 SwiGLU experts, top-2
    "Mixtral 8x7B": ModelSpec(32, 4096, 32, 4096, 32000, global_batch=64, name="Mixtral 8x7B", kv_heads=8,
                              ffn_hidden=14336, moe=MoESpec(8, 2, 14336), **_LLAMA),
    # DeepSeek-V3 (Section 4.2; FFN 18432 of the 3 dense layers and vocabulary 129,280 from its config): its MLA
    # attention is no heads/kv_heads shape, so it is described as plain attention (4h^2 a layer) and corrected below
    "DeepSeek-V3": ModelSpec(61, 7168, 128, 4096, 129280, global_batch=15360, name="DeepSeek-V3", ffn_hidden=18432,
                             moe=MoESpec(256, 8, 2048, shared_experts=1, first_dense=3), **_LLAMA),
}
# (model, published total, published active or None, half the last printed digit of each, what active counts, source)
PUBLISHED_COUNTS = (
    ("Llama 3 8B", 8_030_261_248, None, (0, 0), "", "Hugging Face safetensors total, meta-llama/Llama-3.1-8B"),
    ("Llama 3 70B", 70_553_706_496, None, (0, 0), "", "Hugging Face safetensors total, meta-llama/Llama-3.1-70B"),
    ("Mixtral 8x7B", 46.7e9, 12.9e9, (0.05e9, 0.05e9), "both embeddings",
     "Mistral AI's Mixtral release: 46.7B total, 12.9B active (arXiv:2401.04088 rounds to 47B and 13B)"),
    ("DeepSeek-V3", 671e9, 36.6e9, (0.5e9, 0.05e9), "output head, not the input lookup table",
     f"{_DSV3}: 671B total; its README_WEIGHTS: 36.6B activated including the 0.9B output head"),
)
# MLA (DeepSeek-V2, arXiv:2405.04434, Section 2.1; V3's Section 4.2: 128 heads, query rank 1536, K/V rank 512,
# per-head 128 without and 64 with RoPE, V 128)
MLA = dict(heads=128, q_rank=1536, kv_rank=512, qk_nope=128, qk_rope=64, v_dim=128)


def mla_attention_params(hidden: int, heads: int, q_rank: int, kv_rank: int, qk_nope: int, qk_rope: int,
                         v_dim: int) -> int:
    """One MLA layer's attention: query down/up projections, the joint K/V down projection (with the shared RoPE
    key), the K/V up projection, the two latent RMSNorms and the output projection."""
    return (hidden * q_rank + q_rank * heads * (qk_nope + qk_rope) + hidden * (kv_rank + qk_rope)
            + kv_rank * heads * (qk_nope + v_dim) + q_rank + kv_rank + heads * v_dim * hidden)


def parameter_rows() -> list[dict]:
    """Per model: the planner's total and active parameters beside the published figures (DeepSeek-V3 with its
    plain-attention stand-in replaced by MLA's count, the one correction made, shown as its own column)."""
    rows = []
    for name, total, active, rounding, convention, source in PUBLISHED_COUNTS:
        model = TODAYS_SHAPES[name]
        mla = 0 if name != "DeepSeek-V3" else model.layers * (4 * model.hidden ** 2
                                                              - mla_attention_params(model.hidden, **MLA))
        lookup = model.vocab * model.hidden if convention.startswith("output head") else 0
        rows.append({"model": name, "planner total": model.num_params, "MLA correction": -mla,
                     "published total": total, "total off by": model.num_params - mla - total,
                     "planner active": model.active_params - mla - lookup if active else None,
                     "published active": active, "total rounding": rounding[0], "active rounding": rounding[1], "active counts": convention,
                     "source": source})
    return rows


# DeepSeek-V3's pre-training run, Section 3.1-3.2: 2048 H800 GPUs, 8 a node; 16-way pipeline, 64-way expert
# parallelism spanning 8 nodes, ZeRO-1 data parallelism, no tensor parallelism. NVLink 160 GB/s and IB 50 GB/s as
# measured there (Section 3.2.2); the H800 SXM has the H100 SXM's tensor cores (its NVLink is cut), so its bf16 peak
# is the kit's H100 SXM figure. Sequence 4096 and the batch's final 15,360 sequences: Section 4.2.
DEEPSEEK_V3_RUN = {"gpus_per_node": 8, "nodes": 256, "dp": 128, "tp": 1, "pp": 16, "cp": 1, "ep": 64, "zero": 1,
                   "intra_gb_s": 160, "inter_gb_s": 50, "source": f"{_DSV3}, Sections 3.1, 3.2 and 4.2"}


def deepseek_v3_setup() -> tuple[ModelSpec, DeviceSpec, ClusterSpec]:
    """The model, device and cluster of DeepSeek-V3's published run, as the planner takes them."""
    run, h100 = DEEPSEEK_V3_RUN, DeviceSpec.from_table("NVIDIA H100 SXM", 80)
    device = replace(h100, name="NVIDIA H800 SXM (H100 SXM tensor cores)")
    cluster = ClusterSpec(run["gpus_per_node"], run["nodes"], intra=Link(5e-6, 1 / (run["intra_gb_s"] * 1e9)),
                          inter=Link(20e-6, 1 / (run["inter_gb_s"] * 1e9)))
    return TODAYS_SHAPES["DeepSeek-V3"], device, cluster


def published_run_rank(ranked: list[Prediction]) -> dict:
    """Where the published mesh's best variant (micro-batch and recomputation are not published) ranks among
    every layout and among the distinct meshes, beside the planner's winner, each term named."""
    run = DEEPSEEK_V3_RUN
    mesh_of = lambda p: tuple(getattr(p.layout, a) for a in ("dp", "tp", "pp", "cp", "ep"))  # noqa: E731
    want = tuple(run[a] for a in ("dp", "tp", "pp", "cp", "ep"))
    index = next(i for i, p in enumerate(ranked) if mesh_of(p) == want and p.layout.zero == run["zero"])
    meshes = list(dict.fromkeys(mesh_of(p) for p in ranked if p.fits))
    published, best = ranked[index], ranked[0]
    return {"published": published, "winner": best, "rank": index + 1, "of": len(ranked),
            "mesh rank": meshes.index(want) + 1 if published.fits else None, "meshes that fit": len(meshes),
            "slower by": published.step_s / best.step_s, "source": run["source"]}
