"""The planner's memory at scale, against the paper it is built on: Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (arXiv:2205.05198).

Two kinds of check. (1) Their closed forms, recomputed here independently of the planner's term-by-term sum: the
first pipeline stage keeps sbhL/t (34 + 5as/h) bytes with tensor + sequence parallelism under 1F1B (Section 4.2.3,
Eq. 5), 34 sbhL/t with selective recomputation (Eq. 6), 2sbhL/t with full recomputation (Table 2, last row; the
planner adds the one layer recomputed in backward). (2) Their reported figures, where traced: Section 5 says
selective recomputation saves 70% of the activation memory for GPT-3 (a=96, s=2048, h=12288: 5as/h = 80) and 65%
for MT-NLG (a=128, s=2048, h=20480: 5as/h = 64). The 7B- and 70B-class shapes below are shapes given here (layers,
hidden, heads), not figures from a paper.
"""
from __future__ import annotations

from dataclasses import replace

from labkit.plan.specs import DeviceSpec, Layout, ModelSpec, memory_terms

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
