"""`labkit plan`: every feasible (dp, tp, pp, cp, ZeRO, micro-batch, checkpointing) for a transformer on a cluster,
with memory per rank and step time predicted term by term, ranked, and why the winner wins.

Calls `labkit.plan.planner.plan`, the function notebook 14 uses; nothing is run on the GPUs.
"""
from __future__ import annotations

import argparse

from labkit.cli.common import (add_output_flags, fmt, format_table, int_list, jsonable, positive_float,
                               positive_int_arg, print_json, subparser)

PRESETS = {"7b": (32, 4096, 32, 4096, 32000), "70b": (80, 8192, 64, 4096, 32000)}
# a link slower or later than these is a typo (a rate in bytes given as GB/s), not a network: refused in one line
MIN_LINK_GB_S = 1e-3          # 1 MB/s, slower than any network a GPU cluster was built with
MAX_LINK_ALPHA_US = 1e6       # one second per message


def _model(args: argparse.Namespace):  # noqa: ANN202 - keeps labkit.plan out of --help
    """The ModelSpec from --preset, overridden by any of --layers/--hidden/--heads/--seq-len/--vocab; a shape that
    differs from the preset's is named "custom", never the preset's name."""
    from labkit.plan.specs import ModelSpec

    base = dict(zip(("layers", "hidden", "heads", "seq_len", "vocab"), PRESETS[args.preset]))
    given = {k: getattr(args, k) for k in base if getattr(args, k) is not None}
    shape = {**base, **given}
    return ModelSpec(**shape, global_batch=args.global_batch, name=args.preset if shape == base else "custom")


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
        f"vocab {model.vocab})")
    return f"{name}: {model.num_params / 1e9:.1f} B parameters on {cluster.nodes} x {cluster.gpus_per_node} {device.name}"


def run(args: argparse.Namespace) -> int:
    """Plan, print the top layouts (or JSON) and the reason the first wins; exit 1 when nothing fits."""
    from labkit.plan.planner import plan, why_it_wins
    from labkit.plan.specs import ClusterSpec, DeviceSpec

    model = _model(args)
    device = DeviceSpec.from_table(args.gpu, args.memory_gib, args.dtype, args.efficiency)
    cluster = ClusterSpec(args.gpus_per_node, args.nodes, intra=_link(args.intra_alpha_us, args.intra_gb_s, "intra"),
                          inter=_link(args.inter_alpha_us, args.inter_gb_s, "inter"))
    ranked = plan(model, device, cluster, tuple(args.micro_batches))
    reason = why_it_wins(ranked)
    rows = [p.row() for p in ranked[:args.top]]
    if args.json:
        print_json(jsonable({"model": model, "device": device.name, "reason": reason, "layouts": rows}))
    else:
        columns = [("layout", "layout", str), ("fits", "fits", str), ("memory_GiB", "GiB/rank", fmt(".1f")),
                   ("step_s", "step s", fmt(".3g")), ("compute s", "compute s", fmt(".3g")),
                   ("TP all-reduces s", "TP s", fmt(".3g")), ("pipeline bubble s", "bubble s", fmt(".3g")),
                   ("DP gradient sync s", "DP s", fmt(".3g"))]
        print(format_table(rows, columns, title=_title(model, cluster, device)))
        print(reason)
    return 0 if ranked[0].fits else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `plan`."""
    p = subparser(sub, "plan", help="which parallelism: predict memory and step time of every layout, rank them",
                  description="Enumerate every (dp, tp, pp, cp, ZeRO stage, micro-batch, checkpointing) that splits "
                              "the model over the cluster; predict memory per rank (parameters, gradients, optimizer "
                              "state, activations: ZeRO and Korthikanti et al. 2022) and step time (FLOPs at peak x "
                              "efficiency, alpha-beta collectives, the 1F1B bubble); print the fastest that fit. "
                              "Exit status 1 when nothing fits.",
                  examples=["labkit plan --preset 7b --nodes 1",
                            "labkit plan --preset 70b --nodes 4 --inter-gb-s 50 --top 5",
                            "labkit plan --layers 24 --hidden 2048 --heads 16 --seq-len 2048 --vocab 50000 --json"])
    p.add_argument("--preset", choices=sorted(PRESETS), default="7b", help="model shape to start from (default 7b)")
    for flag in ("--layers", "--hidden", "--heads", "--seq-len", "--vocab"):
        p.add_argument(flag, type=positive_int_arg, default=None, help=f"override the preset's {flag[2:]}")
    p.add_argument("--global-batch", type=positive_int_arg, default=64, help="sequences per step (default 64)")
    p.add_argument("--gpu", default="NVIDIA H100 SXM", help="a GPU of the kit's peak table (default H100 SXM)")
    p.add_argument("--memory-gib", type=positive_float, default=80.0, help="memory per GPU (default 80)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "tf32", "fp32"), default="bf16", help="math mode (default bf16)")
    p.add_argument("--efficiency", type=positive_float, default=0.4,
                   help="fraction of the peak a training step reaches, measured (default 0.4)")
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
