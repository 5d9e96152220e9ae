"""`labkit roofline`: the machine's two roofs, measured, and a training step's top operators with their wall.

Calls `labkit.profile.roofs.measure_roofs` and `labkit.profile.operators`, the same functions notebook 03b uses.
"""
from __future__ import annotations

import argparse

from labkit.cli.common import (add_output_flags, add_results_flag, device_name, fmt, format_table, jsonable,
                               nonnegative_int_arg, parse_bytes, positive_int_arg, print_json, results_file, subparser)
from labkit.core.progress import progress_bar
from labkit.core.results import ResultStream, keep_finished

ROOFLINE_MODELS = ("resnet18", "transformer")


def _workload(args: argparse.Namespace, device):  # noqa: ANN001, ANN202 - torch types stay out of --help
    """(model, batch) for --model at --batch-size: images for ResNet-18, token embeddings for the block."""
    import torch

    from labkit.core.env import seed_everything
    from labkit.core.models import TransformerBlock, build_model

    seed_everything(args.seed)
    b = args.batch_size
    if args.model == "resnet18":
        x = torch.randn(b, 3, args.image_size, args.image_size, device=device)
        model = build_model("resnet18", 10, (3, args.image_size, args.image_size))
    else:
        x = torch.randn(b, args.seq_len, args.d_model, device=device)
        model = TransformerBlock(10, d_model=args.d_model, n_heads=4)
    return model.to(device), (x, torch.randint(0, 10, (b,), device=device))


def run(args: argparse.Namespace) -> int:
    """Measure the roofs, account one training step's operators, print both (or JSON); each part saved as it ends."""
    from labkit.core.device import get_device
    from labkit.profile.operators import aggregate, record_training_steps
    from labkit.profile.roofs import RoofConfig, measure_roofs

    if args.d_model % 4:
        raise ValueError(f"--d-model must be a multiple of 4 (the block has 4 heads), got {args.d_model}")
    config = RoofConfig(min_matmul_n=min(256, args.max_matmul), max_matmul_n=args.max_matmul,
                        bandwidth_bytes=args.bandwidth_bytes, repeats=args.repeats)
    device = get_device(args.device)
    stream = ResultStream(results_file(args.results, "roofline", f"{args.model}.jsonl"), 2,
                          "parts (the roofs, then the operators)")
    with keep_finished(stream, lambda rows: show_parts(rows, args.json)), \
            progress_bar(total=2, desc="roofs, then operators", unit="part", enabled=not args.no_progress) as bar:
        roofs = measure_roofs(device, config)
        stream.add({"part": "roofs", "device": roofs.device, "datasheet": roofs.compute["fp32"].source,
                    "roofs": roofs.table(), "ridge_flops_per_byte": roofs.ridge_flops_per_byte(),
                    "bandwidth_bytes_per_s": roofs.bandwidth_bytes_per_s}, to_json=jsonable)
        bar.update(1)
        model, batch = _workload(args, device)
        ops = aggregate(record_training_steps(model, batch, steps=args.steps, device=device), args.steps, roofs)
        stream.add({"part": "operators", "model": args.model, "batch_size": args.batch_size,
                    "top_ops": [{**vars(r), "intensity_flops_per_byte": r.intensity_flops_per_byte,
                                 "measured_over_predicted": r.measured_over_predicted} for r in ops[:args.top]]},
                   to_json=jsonable)
        bar.update(1)
    roofs_part, ops_part = stream.rows
    if args.json:
        print_json({**{k: v for k, v in roofs_part.items() if k not in ("part", "datasheet")},
                    **{k: v for k, v in ops_part.items() if k != "part"}})
        return 0
    print(roofs_text(roofs_part))
    rows = [{"op": r["name"], "shapes": r["shapes"][:36], "ms": r["time_s"] * 1e3, "roof_ms": r["predicted_s"] * 1e3,
             "ai": r["intensity_flops_per_byte"], "bound": r["bound"]} for r in ops_part["top_ops"]]
    print(format_table(rows, [("op", "operator", str), ("shapes", "input shapes", str),
                              ("ms", "measured ms/step", fmt(".3f")), ("roof_ms", "roofline ms/step", fmt(".3f")),
                              ("ai", "FLOP/byte", fmt(".2f")), ("bound", "bound", str)],
                       title=f"Top {len(rows)} operators of a {args.model} training step (batch {args.batch_size})"))
    print(f"\nsaved as each part finished: {stream.path}")
    return 0


def roofs_text(part: dict) -> str:
    """The measured roofs and the ridge point, as printed (also when the operators never ran)."""
    table = format_table(part["roofs"], [("roof", "roof", str), ("best", "roof (best)", fmt(".2f")),
                                         ("median", "median", fmt(".2f")), ("p10", "p10", fmt(".2f")),
                                         ("p90", "p90", fmt(".2f")), ("unit", "unit", str),
                                         ("datasheet", "datasheet", fmt(".0f")), ("fraction", "fraction", fmt(".0%"))],
                         title=f"Measured roofs on {part['device']} (datasheet: {part['datasheet']})")
    return f"{table}\n\nridge point: {part['ridge_flops_per_byte']:.1f} FLOP/byte (fp32 matmul roof / bandwidth roof)\n"


def show_parts(parts: list[dict], as_json: bool) -> None:
    """What finished before an interrupt or a timeout: the roofs (the operators never stream on their own)."""
    if as_json:
        print_json({"parts": parts, "complete": False})
    else:
        print(roofs_text(parts[0]))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `roofline`."""
    p = subparser(sub, "roofline", help="measure the two roofs and place a step's operators under them",
                  description="Measure peak matmul FLOP/s per dtype and sustained memory bandwidth (copy, triad), "
                              "then time and account every operator of one training step (FLOPs, bytes, "
                              "arithmetic intensity) and say which roof bounds it (Williams, Waterman & Patterson, "
                              "CACM 2009).",
                  examples=["labkit roofline",
                            "labkit roofline --model transformer --batch-size 16 --top 15",
                            "labkit roofline --max-matmul 4096 --bandwidth-bytes 256M --json"])
    p.add_argument("--model", choices=ROOFLINE_MODELS, default="resnet18", help="workload (default resnet18)")
    p.add_argument("--batch-size", type=positive_int_arg, default=16, help="samples per step (default 16)")
    p.add_argument("--image-size", type=positive_int_arg, default=16, help="ResNet-18 image side (default 16)")
    p.add_argument("--seq-len", type=positive_int_arg, default=64, help="transformer tokens per sample (default 64)")
    p.add_argument("--d-model", type=positive_int_arg, default=128, help="transformer width (default 128)")
    p.add_argument("--steps", type=positive_int_arg, default=2, help="recorded training steps (default 2)")
    p.add_argument("--max-matmul", type=positive_int_arg, default=1024, help="largest matmul side swept (default 1024)")
    p.add_argument("--bandwidth-bytes", type=parse_bytes, default=64 * 2**20,
                   help="bytes per array for copy and triad (default 64M)")
    p.add_argument("--repeats", type=positive_int_arg, default=5, help="timed repeats per roof (default 5)")
    p.add_argument("--top", type=positive_int_arg, default=10, help="operators to list (default 10)")
    p.add_argument("--device", type=device_name, default=None, help="cpu, cuda or cuda:N (default: first GPU, else CPU)")
    p.add_argument("--seed", type=nonnegative_int_arg, default=0, help="random seed (default 0)")
    add_results_flag(p, "runs/roofline/MODEL.jsonl")
    add_output_flags(p)
    p.set_defaults(func=run)
