"""`labkit plan`: every feasible (dp, tp, pp, cp, ep, ZeRO, micro-batch, checkpointing) for a transformer on a cluster,
with memory per rank and step time predicted term by term, ranked, and why the winner wins.

Calls `labkit.plan.planner.plan`, the function notebook 14 uses; nothing is run on the GPUs.
"""
from __future__ import annotations

import argparse

from labkit.cli.common import (add_output_flags, fmt, format_table, int_list, jsonable, positive_float,
                               positive_int_arg, print_json, subparser)

SHAPE = ("layers", "hidden", "heads", "seq_len", "vocab")
# GPT-style shapes (the planner's 7B- and 70B-class), and two of today's, their shapes from the models' configs
# (Meta's Llama 3 8B: hidden 4096, 32 layers, 32 heads, 8 K/V heads, SwiGLU 14336, vocab 128256, untied;
# Mixtral 8x7B, Jiang et al. 2024, arXiv:2401.04088: Llama's attention, 8 experts of 14336, top-2, vocab 32000)
_LLAMA = dict(kv_heads=8, ffn_hidden=14336, gated_ffn=True, tied_embeddings=False, learned_positions=False,
              biases=False)
PRESETS = {"7b": ((32, 4096, 32, 4096, 32000), {}), "70b": ((80, 8192, 64, 4096, 32000), {}),
           "llama3-8b": ((32, 4096, 32, 8192, 128256), _LLAMA),
           "mixtral-8x7b": ((32, 4096, 32, 4096, 32000), {**_LLAMA, "moe": dict(experts=8, top_k=2, expert_ffn=14336)})}
MOE_FLAGS = ("experts", "top_k", "expert_ffn", "shared_experts", "moe_every", "first_dense")
# every step-time term the planner adds, in its order, and the header the table gives it: the columns add up
TIME_COLUMNS = (("compute", "compute s"), ("TP all-reduces", "TP s"), ("CP ring (exposed)", "CP s"),
                ("PP sends", "PP s"), ("EP all-to-alls", "EP s"), ("pipeline bubble", "bubble s"),
                ("DP gradient sync", "DP s"))
# a link slower or later than these is a typo (a rate in bytes given as GB/s), not a network: refused in one line
MIN_LINK_GB_S = 1e-3          # 1 MB/s, slower than any network a GPU cluster was built with
MAX_LINK_ALPHA_US = 1e6       # one second per message


def _model(args: argparse.Namespace):  # noqa: ANN202 - keeps labkit.plan out of --help
    """The ModelSpec from --preset, overridden by any shape or MoE flag; a model that differs from the preset's is
    named "custom", never the preset's name."""
    from labkit.plan.shapes import MoESpec
    from labkit.plan.specs import ModelSpec

    shape, extras = PRESETS[args.preset]
    base = {**dict(zip(SHAPE, shape)), **{k: v for k, v in extras.items() if k != "moe"}}
    given = {k: getattr(args, k) for k in SHAPE + ("kv_heads", "ffn_hidden") if getattr(args, k) is not None}
    if args.untied:
        given["tied_embeddings"] = False
    if args.swiglu:
        given["gated_ffn"] = True
    moe = dict(extras.get("moe", {}))
    moe.update({k.replace("moe_every", "every"): getattr(args, k) for k in MOE_FLAGS if getattr(args, k) is not None})
    spec = {**base, **given}
    if moe and "expert_ffn" not in moe:
        moe["expert_ffn"] = spec.get("ffn_hidden") or 4 * spec["hidden"]
    if moe and "experts" not in moe:
        raise ValueError("--top-k/--expert-ffn/--shared-experts/--moe-every/--first-dense describe experts: give "
                         "--experts too")
    same = spec == base and moe == dict(extras.get("moe", {}))
    return ModelSpec(**spec, global_batch=args.global_batch, moe=MoESpec(**{"top_k": 1, **moe}) if moe else None,
                     name=args.preset if same else "custom")


def _link(alpha_us: float, gb_s: float, tier: str):  # noqa: ANN202 - keeps labkit.comm out of --help
    """One tier's alpha-beta Link from the flags, checked before any arithmetic (a near-zero rate is 'nan s')."""
    from labkit.comm.two_tier import Link

    if gb_s < MIN_LINK_GB_S:
        raise ValueError(f"--{tier}-gb-s {gb_s:g} is slower than any network ({MIN_LINK_GB_S:g} GB/s = 1 MB/s at "
                         "least); give the link's rate in GB/s")
    if alpha_us > MAX_LINK_ALPHA_US:
        raise ValueError(f"--{tier}-alpha-us {alpha_us:g} is over a second per message (at most "
                         f"{MAX_LINK_ALPHA_US:g} us); give the latency in microseconds")
    return Link(alpha_us * 1e-6, 1 / (gb_s * 1e9))


def _title(model, cluster, device) -> str:  # noqa: ANN001 - specs imported lazily
    """'7b: 6.7 B parameters on ...', or the custom shape spelt out."""
    name = model.name if model.name != "custom" else (
        f"custom ({model.layers} layers, hidden {model.hidden}, {model.heads} heads, seq {model.seq_len}, "
        f"vocab {model.vocab}" + (f", {model.moe.experts} experts top-{model.moe.top_k}" if model.moe else "") + ")")
    active = f" ({model.active_params / 1e9:.1f} B active)" if model.moe else ""
    return (f"{name}: {model.num_params / 1e9:.1f} B parameters{active} on {cluster.nodes} x {cluster.gpus_per_node} "
            f"{device.name}")


def table_columns() -> list[tuple]:
    """The table's columns: the layout, fit, memory, the step time and every term it sums (they add up)."""
    return [("layout", "layout", str), ("group", "group", str), ("fits", "fits", str),
            ("memory_GiB", "GiB/rank", fmt(".1f")), ("step_s", "step s", fmt(".3g")), ("MFU", "MFU", fmt(".0%"))] + [(f"{term} s", header, fmt(".3g")) for term, header in TIME_COLUMNS]


def run(args: argparse.Namespace) -> int:
    """Plan, print the top layouts (or JSON) and the reason the first wins; exit 1 when nothing fits."""
    from labkit.plan.planner import plan, top_group, why_it_wins
    from labkit.plan.specs import ClusterSpec, DeviceSpec

    model = _model(args)
    device = DeviceSpec.from_table(args.gpu, args.memory_gib, args.dtype, args.efficiency)
    cluster = ClusterSpec(args.gpus_per_node, args.nodes, intra=_link(args.intra_alpha_us, args.intra_gb_s, "intra"),
                          inter=_link(args.inter_alpha_us, args.inter_gb_s, "inter"))
    ranked = plan(model, device, cluster, tuple(args.micro_batches), max_cp=args.max_cp,
                  uneven_stages=args.uneven_stages)
    reason = why_it_wins(ranked)
    group = {id(p) for p in top_group(ranked)}
    rows = [{**p.row(), "group": "top" if id(p) in group else "",
             "MFU": model.step_flops() / (p.step_s * cluster.world_size * device.peak_flops_per_s)}
            for p in ranked[:args.top]]
    if args.json:
        print_json(jsonable({"model": model, "device": device.name, "efficiency": device.efficiency,
                             "reason": reason, "top_group": [p.layout.label() for p in top_group(ranked)],
                             "layouts": rows}))
    else:
        print(format_table(rows, table_columns(), title=_title(model, cluster, device)))
        print(reason)
    return 0 if ranked[0].fits else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `plan`."""
    p = subparser(sub, "plan", help="which parallelism: predict memory and step time of every layout, rank them",
                  description="Enumerate every (dp, tp, pp, cp, ep, ZeRO stage, micro-batch, checkpointing) that "
                              "splits the model (GQA, SwiGLU, untied embeddings and a mixture of experts can be "
                              "described) over the cluster; predict memory per rank (parameters, gradients, optimizer "
                              "state, activations: ZeRO and Korthikanti et al. 2022; experts divided by ep) and step "
                              "time (each GEMM at its shape's rate, element-wise work at memory bandwidth, the "
                              "output layer on the last pipeline stage, alpha-beta collectives and all-to-alls, the "
                              "1F1B / interleaved / ZB-H1 bubble); print the fastest that fit, every time term a "
                              "column, the top group (within 10 %, a tie) marked. Exit status 1 when nothing fits.",
                  examples=["labkit plan --preset 7b --nodes 1",
                            "labkit plan --preset 70b --nodes 4 --inter-gb-s 50 --top 5",
                            "labkit plan --layers 24 --hidden 2048 --heads 16 --seq-len 2048 --vocab 50000 --json",
                            "labkit plan --preset mixtral-8x7b --nodes 4 --top 5"])
    p.add_argument("--preset", choices=sorted(PRESETS), default="7b", help="model shape to start from (default 7b)")
    for flag in ("--layers", "--hidden", "--heads", "--seq-len", "--vocab", "--kv-heads", "--ffn-hidden"):
        p.add_argument(flag, type=positive_int_arg, default=None, help=f"override the preset's {flag[2:]}")
    p.add_argument("--swiglu", action="store_true", help="a SwiGLU feed-forward (three matrices)")
    p.add_argument("--untied", action="store_true", help="untied input and output embeddings")
    for flag, what in (("--experts", "routed experts (a mixture of experts)"), ("--top-k", "experts per token"),
                       ("--expert-ffn", "each expert's FFN size"), ("--moe-every", "an MoE layer every n-th layer")):
        p.add_argument(flag, type=positive_int_arg, default=None, help=what)
    for flag, what in (("--shared-experts", "always-on experts"), ("--first-dense", "leading dense layers")):
        p.add_argument(flag, type=int, default=None, help=what)
    p.add_argument("--max-cp", type=positive_int_arg, default=None, help="largest context-parallel size tried "
                   "(default: no cap)")
    p.add_argument("--uneven-stages", action="store_true", help="let pipeline stages differ by a layer")
    p.add_argument("--global-batch", type=positive_int_arg, default=64, help="sequences per step (default 64)")
    p.add_argument("--gpu", default="NVIDIA H100 SXM", help="a GPU of the kit's peak table (default H100 SXM)")
    p.add_argument("--memory-gib", type=positive_float, default=80.0, help="memory per GPU (default 80)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "tf32", "fp32"), default="bf16", help="math mode (default bf16)")
    p.add_argument("--efficiency", type=positive_float, default=None,
                   help="fraction of the peak a large GEMM reaches (default: the GPU's cited measured rate, "
                        "labkit.plan.rates.MAMF, else 0.4); smaller GEMMs are derated by their shape")
    p.add_argument("--gpus-per-node", type=positive_int_arg, default=8, help="GPUs per node (default 8)")
    p.add_argument("--nodes", type=positive_int_arg, default=1, help="nodes (default 1)")
    p.add_argument("--intra-alpha-us", type=positive_float, default=5.0, help="intra-node latency, us (default 5)")
    p.add_argument("--intra-gb-s", type=positive_float, default=150.0, help="intra-node GB/s per GPU (default 150)")
    p.add_argument("--inter-alpha-us", type=positive_float, default=20.0, help="inter-node latency, us (default 20)")
    p.add_argument("--inter-gb-s", type=positive_float, default=25.0, help="inter-node GB/s per GPU (default 25)")
    p.add_argument("--micro-batches", type=int_list, default=[1, 2, 4], help="micro-batch sizes tried (default 1,2,4)")
    p.add_argument("--top", type=positive_int_arg, default=10, help="layouts to list (default 10)")
    add_output_flags(p)
    p.set_defaults(func=run)
