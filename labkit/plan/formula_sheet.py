"""The course's one-page formula sheet, generated from the kit's own formulas (issue 52).

Each row names a formula as the notebooks teach it, the kit function that computes it (the one every notebook,
check and the planner call), where it is taught, its primary source, and one worked value at a real scale computed
by that same function: Llama 3 8B and 70B (``labkit.plan.published.TODAYS_SHAPES``) on H100s from the kit's one peak
table, with the planner's default links between them. ``scripts/formula_sheet.py`` writes ``docs/formulas.md``;
a test keeps the page equal to what this module computes. The worked problem at the end asks what every engineer
asks first: does Llama 3 70B train with ZeRO-3 on 64 x 80 GB, and what does one layer's all-gather cost?

Llama 3 is the course's running example on paper: each parallelism notebook ends its lessons with the rows it teaches
worked at that scale (:func:`real_scale_markdown`), and notebook 11 poses the worked problem with its answer hidden
until the learner asks (:data:`WORKED_ZERO3`, ``.reveal()``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from labkit.checkpoint.interval import young_interval_s
from labkit.comm.bench import busbw_factor
from labkit.comm.collectives import allreduce_cost
from labkit.parallel.context.ring_attention import ring_peak_bytes
from labkit.parallel.experts.traffic import ep_bytes_per_layer
from labkit.parallel.overlap.exposed import exposed_time_s
from labkit.parallel.pipeline.schedule_sim import predicted_bubble
from labkit.parallel.tensor.cost import korthikanti_bytes, tp_bytes_per_layer
from labkit.plan.planner import predict
from labkit.plan.published import TODAYS_SHAPES
from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout
from labkit.sharding.comm_volume import ring_bytes_sent
from labkit.sharding.memory import zero_paper_bytes
from labkit.training.to_target import critical_batch

GIB = 2**30
BF16 = 2                                  # bytes per element of the worked examples (bf16 weights and activations)
LLAMA_8B, LLAMA_70B = TODAYS_SHAPES["Llama 3 8B"], TODAYS_SHAPES["Llama 3 70B"]
H100 = DeviceSpec.from_table("NVIDIA H100 SXM", 80, "bf16")
NODE = ClusterSpec(8, 1)                  # one node of 8 GPUs; the planner's default intra-node link
RACK = ClusterSpec(8, 8)                  # 64 GPUs on 8 nodes; the planner's default inter-node link between them


@dataclass(frozen=True)
class Formula:
    """One row: what it computes, the formula, the kit function, where it is taught, its source, and a worked value
    (a sentence computed by calling the function on the inputs it names)."""

    topic: str
    formula: str
    function: Callable
    notebook: str
    source: str
    worked: Callable[[], str]

    @property
    def where(self) -> str:
        """The kit function as ``module.name``, for the reader to open."""
        return f"{self.function.__module__}.{self.function.__qualname__}"


def _layer_bytes(model) -> float:
    """bf16 bytes of one transformer layer's weights (the parameters less embeddings, over the layers)."""
    outer = model.vocab * model.hidden * (1 if model.tied_embeddings else 2)
    return BF16 * (model.num_params - outer) / model.layers


def _ring_all_reduce() -> str:
    n = BF16 * LLAMA_8B.num_params
    t = allreduce_cost("ring", 8, n, NODE.intra.alpha_s, NODE.intra.beta_s_per_byte)
    return f"Llama 3 8B's bf16 gradients ({n / GIB:.1f} GiB) over 8 GPUs of one node: {t:.3f} s"


def _young() -> str:
    save_s, mtbf_h = 60.0, 24.0
    return (f"a 60 s save and a failure every {mtbf_h:.0f} h (inputs of the example, not measured): save every "
            f"{young_interval_s(save_s, mtbf_h * 3600) / 60:.0f} min")


def _worked_zero3() -> str:
    layout = Layout(dp=64, zero=3, micro_batch=1, checkpointing=True)
    p = predict(LLAMA_70B, H100, RACK, layout)
    gather_s = allreduce_cost("ring", 64, int(_layer_bytes(LLAMA_70B)), RACK.inter.alpha_s,
                              RACK.inter.beta_s_per_byte) / 2         # an all-gather is half a ring all-reduce
    terms = ", ".join(f"{k} {v / GIB:.1f}" for k, v in p.memory.items())
    return (f"Llama 3 70B ({LLAMA_70B.num_params / 1e9:.1f} B parameters), ZeRO-3 on {RACK.world_size} x 80 GB "
            f"H100, micro-batch 1, full checkpointing: {p.memory_bytes / GIB:.1f} GiB per rank "
            f"({'fits' if p.fits else 'does not fit'} in 80 GB; GiB by term: {terms}). One layer's bf16 weights "
            f"({_layer_bytes(LLAMA_70B) / GIB:.2f} GiB) all-gathered over the {RACK.world_size} ranks on the "
            f"inter-node link: {gather_s * 1e3:.0f} ms, twice a step (forward and backward) per layer.")


FORMULAS = (
    Formula("ring all-reduce time", "T = 2(R-1)(alpha + n beta / R)", allreduce_cost, "06, 07",
            "Patarasuk & Yuan 2009 (J. Parallel Distrib. Comput. 69(2))", _ring_all_reduce),
    Formula("bus bandwidth", "busbw = algbw x 2(R-1)/R (all-reduce)", busbw_factor, "06",
            "NVIDIA nccl-tests, doc/PERFORMANCE.md",
            lambda: f"R = 8: busbw = {busbw_factor(8):.3f} x algbw"),
    Formula("bytes a rank sends", "all-reduce 2(R-1)/R N; reduce-scatter, all-gather (R-1)/R N", ring_bytes_sent,
            "11", "Patarasuk & Yuan 2009; Rajbhandari et al. 2020 (arXiv:1910.02054), Section 7",
            lambda: f"all-gather of one Llama 3 70B layer's bf16 weights over 64 ranks: "
                    f"{ring_bytes_sent('all_gather', int(_layer_bytes(LLAMA_70B)), 64) / GIB:.2f} GiB sent per rank"),
    Formula("ZeRO model state per rank", "DDP (2+2+K)P; ZeRO-1 4P + KP/R; ZeRO-2 2P + (2+K)P/R; ZeRO-3 (4+K)P/R, "
            "K = 12", zero_paper_bytes, "11", "Rajbhandari et al. 2020 (arXiv:1910.02054), Figure 1",
            lambda: f"Llama 3 70B on 64 ranks: DDP {zero_paper_bytes(LLAMA_70B.num_params, 'ddp', 64) / GIB:.0f} GiB, "
                    f"ZeRO-3 {zero_paper_bytes(LLAMA_70B.num_params, 'zero3', 64) / GIB:.1f} GiB"),
    Formula("pipeline bubble", "(p-1)/(m+p-1) of the step idle (GPipe, 1F1B)", predicted_bubble, "05, 05b",
            "Huang et al. 2019 (GPipe, arXiv:1811.06965), Section 2.3",
            lambda: f"p = 8 stages, m = 32 micro-batches: {predicted_bubble(8, 32):.1%} idle"),
    Formula("tensor-parallel traffic", "4 all-reduces of b s h per layer (2 forward, 2 backward)", tp_bytes_per_layer,
            "13", "Narayanan et al. 2021 (SC21, arXiv:2104.04473)",
            lambda: f"Llama 3 70B layer, b = 1, s = 8192, tp = 8, bf16: "
                    f"{tp_bytes_per_layer(1, 8192, 8192, 8, BF16) / GIB:.2f} GiB sent per rank"),
    Formula("activations per layer", "s b h (34 + 5 a s / h) bytes; TP divides all but 10 s b h by t",
            korthikanti_bytes, "13, 14", "Korthikanti et al. 2022 (arXiv:2205.05198), Eq. 1-2",
            lambda: f"Llama 3 70B layer, b = 1, s = 8192, t = 8: "
                    f"{korthikanti_bytes(8192, 1, 8192, 64, world_size=8) / GIB:.2f} GiB per rank"),
    Formula("context parallelism (ring) memory", "a rank holds 1/W of Q, K, V and one chunk pair's scores",
            ring_peak_bytes, "14", "Liu et al. 2023 (Ring Attention, arXiv:2310.01889)",
            lambda: f"b = 1, 64 heads of 128, s = 131072 on W = 16, bf16: "
                    f"{sum(ring_peak_bytes(1, 64, 131072, 128, 16, BF16).values()) / GIB:.2f} GiB per rank"),
    Formula("expert-parallel traffic", "4 x copies x h x bytes x (ep-1)/ep per layer", ep_bytes_per_layer, "15",
            "Lepikhin et al. 2020 (GShard, arXiv:2006.16668), Section 2.2",
            lambda: f"8192 tokens top-2, h = 4096 (Mixtral's layer), ep = 8, bf16: "
                    f"{ep_bytes_per_layer(8192 * 2, 4096, 8, BF16) / GIB:.2f} GiB sent per rank"),
    Formula("exposed communication", "T_exposed = max(0, T_comm - T_overlappable)", exposed_time_s, "17",
            "Li et al. 2020 (PyTorch DDP, arXiv:2006.15704), Section 3.2.3",
            lambda: f"a 0.30 s all-reduce behind 0.25 s of backward (inputs of the example): "
                    f"{exposed_time_s(0.30, 0.25):.2f} s exposed"),
    Formula("checkpoint interval", "tau = sqrt(2 C M) (C save cost, M mean time between failures)",
            young_interval_s, "16", "Young 1974 (Commun. ACM 17(9))", _young),
    Formula("critical batch", "B_crit = E_min / S_min, from S/S_min - 1 = (E/E_min - 1)^-1", critical_batch, "02b",
            "McCandlish et al. 2018 (arXiv:1812.06162)",
            lambda: f"S_min = 2,000 steps and E_min = 1.0e6 examples (inputs of the example): "
                    f"B_crit = {critical_batch(2000, 1e6):.0f}"),
)


@dataclass(frozen=True)
class WorkedProblem:
    """A real-scale question whose givens are printed, and whose answer is computed only when asked for."""

    title: str
    question: Callable[[], str]
    answer: Callable[[], str]

    def ask(self) -> None:
        """Print the title and the givens, and how to see the answer."""
        print(f"{self.title}\n{self.question()}\nWork it out, then run .reveal() for the kit's answer.")

    def reveal(self) -> str:
        """Compute, print and return the kit's answer."""
        text = self.answer()
        print(text)
        return text


def _zero3_question() -> str:
    m, link = LLAMA_70B, RACK.inter
    return (f"{m.name}: {m.num_params / 1e9:.1f} B parameters, {m.layers} layers, hidden {m.hidden}, sequence "
            f"{m.seq_len}. It trains with Adam in mixed precision on {RACK.world_size} H100s of 80 GB "
            f"({RACK.nodes} nodes of {RACK.gpus_per_node}), ZeRO-3 over all {RACK.world_size} ranks, micro-batch 1, "
            "every layer checkpointed.\n"
            "1. Does one rank's memory fit in 80 GB? Count the bf16 parameters and gradients and the optimizer "
            "state (K = 12 bytes per parameter, Rajbhandari et al. 2020, Figure 1), each sharded 64 ways, plus the "
            "kept layer inputs, one layer recomputed and the fp32 logits.\n"
            f"2. How long does one layer's all-gather of bf16 weights take on the inter-node link (alpha = "
            f"{link.alpha_s * 1e6:.0f} us, {1 / link.beta_s_per_byte / 1e9:.0f} GB/s)? An all-gather is half a ring "
            "all-reduce: (R-1)(alpha + n beta / R).")


WORKED_ZERO3 = WorkedProblem("Worked problem: does Llama 3 70B fit with ZeRO-3 on 64 x 80 GB, and what does a "
                             "layer's gather cost?", _zero3_question, _worked_zero3)


def real_scale_markdown(notebook: str) -> str:
    """The rows notebook ``notebook`` teaches, each worked at the running example's real scale, as a table; a
    ValueError when the sheet has none for it."""
    rows = [f for f in FORMULAS if notebook in f.notebook.split(", ")]
    if not rows:
        taught = sorted({n for f in FORMULAS for n in f.notebook.split(", ")})
        raise ValueError(f"the formula sheet has no row taught in notebook {notebook!r}; it has {taught}")
    lines = ["| what | formula | at real scale | source |", "|---|---|---|---|"]
    lines += [f"| {f.topic} | {f.formula} | {f.worked()} | {f.source} |" for f in rows]
    return "\n".join(lines)


def sheet_markdown() -> str:
    """The formula sheet as one markdown page: a table (topic, formula, kit function, notebook, source, worked value)
    and the worked problem."""
    lines = ["# Formula sheet", "",
             "Generated by `scripts/formula_sheet.py` from `labkit.plan.formula_sheet`: each worked value below is "
             "computed by the kit function named beside it, the same one the notebooks check. Real scale: Llama 3 "
             "8B and 70B on H100 SXM 80 GB (the kit's peak table), with the planner's default links.", "",
             "| topic | formula | kit function | notebook | source | worked at real scale |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {f.topic} | {f.formula} | `{f.where}` | {f.notebook} | {f.source} | {f.worked()} |"
              for f in FORMULAS]
    lines += ["", "## Worked problem: does it fit, and what does a gather cost?", "", _zero3_question(), "",
              "**Answer.** " + _worked_zero3(), "",
              "Computed with `labkit.plan.planner.predict` (memory by term) and `labkit.comm.collectives."
              "allreduce_cost` (an all-gather is half a ring all-reduce); notebook 14 scores the planner on live "
              "ranks.", ""]
    return "\n".join(lines)
