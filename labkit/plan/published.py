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
Narayanan et al. SC21's Table 1 is the speed test (:func:`sc21_rows`): the published meshes, their TFLOP/s per GPU
predicted with a large GEMM at a traced CUDA 11 rate (the paper's era) and the links at what NCCL achieves on them
(cited) and, beside it, at today's GEMM rate and at the links' line rate.
"""
from __future__ import annotations

from dataclasses import replace

from labkit.comm.two_tier import Link
from labkit.plan.planner import TIE, Prediction, Space, plan, top_group
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
    """Per published model: the planner's saving from selective recomputation beside the paper's figure, and the
    rival's: recomputing the softmax output alone (its 2as/h of Eq. 5's 34 + 5as/h bytes per s b h; the dropout mask
    and the dropout output, the other 3as/h, kept)."""
    device = device or DeviceSpec("any", 80 * 2**30, 1e15)
    rows = []
    for name, heads, seq, hidden, published, source in SELECTIVE_SAVINGS:
        model = ModelSpec(1, hidden, heads, seq, 51200, global_batch=1, name=name)
        full = memory_terms(model, device, Layout(), selective=False)["activations kept"]
        sel = memory_terms(model, device, Layout(), selective=True)["activations kept"]
        attention = heads * seq / hidden                                    # as/h
        rows.append({"model": name, "planner saving": 1 - sel / full, "published saving": published,
                     "difference (points)": 100 * (1 - sel / full - published),
                     "rival: softmax output only": 2 * attention / (34 + 5 * attention), "source": source})
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


# ---- held against practice: Narayanan et al. SC21 (arXiv:2104.04473), Table 1 --------------------------------
SC21 = "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM, SC21"
# (billions, heads, hidden, layers, t, p, GPUs, global batch, achieved TFLOP/s per GPU) - Table 1; every model
# has sequence 2048 and vocabulary 51,200 (Section 5.1 and the Megatron-LM README); A100 80 GB GPUs on Selene, 8 a
# node on NVLink/NVSwitch (600 GB/s both ways: 300 each way) and 8 HDR InfiniBand 200 Gb/s adapters a node (25 GB/s
# a GPU), Section 5. The paper counts FLOPs with full recomputation (its Eq. 3, 96 B s l h^2 (1 + s/6h + V/12lh)).
# Provenance, honestly: the rows are transcribed from the paper's Table 1. What this kit's sources could trace is the
# last row's shape (hidden 25,600, 160 heads, 128 layers, sequence 2048: calculon-ai/calculon models/megatron-1T.json),
# its 3,072 GPUs at 52 % of peak (the paper's abstract: 502 PFLOP/s), the first row's 32 A100s and the 44-52 % range
# (issue 54's own reading of the table); the other rows' shapes, t, p, batch and TFLOP/s were not found in a stored
# copy, so a reader should check them against the paper before relying on one row.
SC21_TABLE1 = ((1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
               (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
               (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
               (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
               (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163))
# The links at what NCCL achieves on them, not their line rates (the GEMMs, likewise, run at a measured rate, not at
# peak). NVLink 3 on the A100: 25 GB/s a link each way, about 20 effective with the SMs' 128-byte payloads; 12 links,
# 240 GB/s, and other limits on the GPU hold NCCL's bus bandwidth to about 230 GB/s (S. Jeaugey, NCCL's lead at
# NVIDIA, NVIDIA/nccl-tests issue 149, 2023-07-05). HDR InfiniBand 200 Gb/s: about 24 GB/s inter-node per adapter
# with GPUDirect RDMA (S. Jeaugey, NVIDIA/nccl issue 412, 2023-04-24). Both were said of NCCL releases after the
# paper's, so they can only flatter its network.
SC21_LINKS = {"intra_gb_s": 230, "inter_gb_s": 24}
SC21_LINE_RATES = {"intra_gb_s": 300, "inter_gb_s": 25}     # Section 5's hardware: what the wires carry
SPEED_BAND = 0.25     # the bar: predicted TFLOP/s per GPU within 25 % of the published
# The paper ran on the CUDA 11 stack of its day (CUDA 12.0 came out in December 2022). The kit's default A100 rate
# (rates.MAMF) was measured with torch 2.6 on CUDA 12.6. The nearest traced measurement on a CUDA 11 stack: an fp16
# 8192 x 8192 x 8192 matmul at 230 TFLOP/s on an A100 80GB, PyTorch 1.13 on CUDA 11.7 (NGC container 22.07).
A100_CUDA11_MATMUL_FLOPS = 230e12
A100_CUDA11_SOURCE = ("M. Li, transformers-benchmarks (github.com/mli/transformers-benchmarks), README 'Micro-"
                      "Benchmarking Summary' and micro_bench.ipynb: MatMul FP16 230 TFLOP/s on an A100 80GB")


def sc21_setup(row: tuple, cuda11: bool = True, line_rate: bool = False
               ) -> tuple[ModelSpec, DeviceSpec, ClusterSpec, Layout]:
    """One Table 1 row as the planner takes it, and the published mesh (dp = GPUs / (t p), no context parallelism,
    full recomputation, no ZeRO: the paper's setting; its micro-batch and interleaving are not in the table).
    ``cuda11``: a large GEMM at :data:`A100_CUDA11_MATMUL_FLOPS`, the stack of the paper's era; False: at today's
    cited rate (:data:`labkit.plan.rates.MAMF`), to show what the newer kernels alone are worth. ``line_rate``: the
    links at :data:`SC21_LINE_RATES` instead of NCCL's achieved :data:`SC21_LINKS`, to show what that is worth."""
    billions, heads, hidden, layers, t, p, gpus, batch, _ = row
    model = ModelSpec(layers, hidden, heads, 2048, 51200, global_batch=batch, name=f"GPT {billions}B (SC21)")
    device = DeviceSpec.from_table("NVIDIA A100 SXM", 80)
    if cuda11:
        device = replace(device, efficiency=A100_CUDA11_MATMUL_FLOPS / device.peak_flops_per_s)
    links = SC21_LINE_RATES if line_rate else SC21_LINKS
    cluster = ClusterSpec(8, gpus // 8, intra=Link(5e-6, 1 / (links["intra_gb_s"] * 1e9)),
                          inter=Link(20e-6, 1 / (links["inter_gb_s"] * 1e9)))
    return model, device, cluster, Layout(dp=gpus // (t * p), tp=t, pp=p, checkpointing=True)


def sc21_space() -> Space:
    """What Megatron-LM offered in 2021: dp, tp, pp, interleaving and recomputation; no context parallelism
    (Liu et al. 2023), no ZeRO in Megatron (its distributed optimizer came later) and no ZB-H1 (Qi et al. 2023)."""
    return Space(cp=(1,), zero=(0,), v=None, zero_bubble=(False,))


def sc21_rows(tie: float | None = None, today: bool = False) -> list[dict]:
    """Per Table 1 row: the published mesh's best paper-like variant (recomputed, no ZeRO, no ZB-H1, any
    micro-batch and interleaving), its predicted TFLOP/s per GPU (the paper's count) beside the published, whether
    it fits, and whether the published mesh is in the planner's top group (its best variant of any kind) among
    the options of 2021 (:func:`sc21_space`), or of today's planner with ``today``. Two more columns price what the
    planner cannot know: the same row at today's GEMM rate, and with the links at their line rate."""
    tie = TIE if tie is None else tie
    space = None if today else sc21_space()
    rows = []
    for row in SC21_TABLE1:
        model, _, cluster, paper = sc21_setup(row)
        ranked, pick, tflops = _paper_speed(row, space)
        _, _, today_tflops = _paper_speed(row, space, cuda11=False)
        wired, _, wired_tflops = _paper_speed(row, space, line_rate=True)
        same = [q for q in ranked if _mesh(q.layout) == _mesh(paper)]
        rows.append({"model": model.name, "GPUs": cluster.world_size, "published t, p": (paper.tp, paper.pp),
                     "batch": model.global_batch, "published TFLOP/s": row[-1], "predicted TFLOP/s": tflops,
                     "ratio": tflops / row[-1], "within band": abs(tflops / row[-1] - 1) <= SPEED_BAND,
                     "ratio at today's GEMM rate": today_tflops / row[-1],
                     "ratio at the links' line rate": wired_tflops / row[-1],
                     "fits": pick.fits, "GiB": pick.memory_bytes / 2**30, "variant": pick.layout.label(),
                     "in top group": _in_top_group(ranked, paper, tie), "winner": ranked[0].layout.label(),
                     "published mesh slower by": min(q.step_s for q in same if q.fits) / ranked[0].step_s,
                     "in top group at line rate": _in_top_group(wired, paper, tie),
                     "group size": len(top_group(ranked, tie)), "source": f"{SC21}, arXiv:2104.04473, Table 1"})
    return rows


def _paper_speed(row: tuple, space: Space | None, **setup: bool) -> tuple[list[Prediction], Prediction, float]:
    """The ranked plan of one row, the published mesh's paper-like variant and its TFLOP/s per GPU (paper's count)."""
    model, device, cluster, paper = sc21_setup(row, **setup)
    ranked = plan(model, device, cluster, micro_batches=(1, 2, 4, 8), selective=False, space=space)
    pick = _paper_like(ranked, paper)
    return ranked, pick, model.step_flops(recompute=True) / (pick.step_s * cluster.world_size) / 1e12


def _in_top_group(ranked: list[Prediction], paper: Layout, tie: float) -> bool:
    group = top_group(ranked, tie)
    return any(q in group for q in ranked if _mesh(q.layout) == _mesh(paper))


def _mesh(layout: Layout) -> tuple[int, ...]:
    return (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep)


def _paper_like(ranked: list[Prediction], paper: Layout) -> Prediction:
    """The published mesh's fastest variant as the paper ran it: recomputed, no ZeRO, no ZB-H1 (fitting first)."""
    like = [q for q in ranked if _mesh(q.layout) == _mesh(paper) and q.layout.checkpointing and q.layout.zero == 0
            and not q.layout.zero_bubble]
    return min(like, key=lambda q: (not q.fits, q.step_s))
