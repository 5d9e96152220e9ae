"""`labkit memory`: one rank's training memory under DDP / ZeRO-1 / ZeRO-2 / ZeRO-3.

Measures the model's activations (``labkit.memory.model.build_memory_model``), applies the strategy's sharding
factors (``labkit.sharding.memory.predict_per_rank``) and prints the per-rank breakdown, the ZeRO paper's
mixed-precision figure for the same parameter count, and the bytes each rank sends per step.
"""
from __future__ import annotations

import argparse

from labkit.cli.common import format_bytes, format_table, positive_int_arg, print_json, subparser
from labkit.core.choices import MODELS, OPTIMIZERS

MAX_WORLD_SIZE = 1 << 16
MAX_BATCH = 1 << 20


def per_rank_report(model_name: str, world_size: int, strategy: str, batch_size: int, optimizer: str) -> dict:
    """The breakdown for one rank as plain data (what --json prints)."""
    from labkit.core.models import build_model, count_parameters
    from labkit.sharding.comm_volume import predicted_bytes_per_step
    from labkit.sharding.memory import STRATEGIES, predict_per_rank, zero_paper_bytes
    from labkit.memory.model import build_memory_model

    model = build_model(model_name)
    memory_model = build_memory_model(model, (3, 32, 32), optimizer="sgd" if optimizer == "sgd_momentum" else optimizer,
                                      momentum=0.9 if optimizer == "sgd_momentum" else 0.0)
    rows = []
    for name in (STRATEGIES if strategy == "all" else (strategy,)):
        part = predict_per_rank(memory_model, batch_size, name, world_size)
        rows.append({"strategy": name, "params_bytes": part.params_bytes, "grads_bytes": part.grads_bytes,
                     "optimizer_bytes": part.optimizer_bytes, "activations_bytes": part.activations_bytes,
                     "total_bytes": part.total_bytes,
                     "zero_paper_mixed_adam_bytes": zero_paper_bytes(count_parameters(model), name, world_size),
                     "comm_bytes_sent_per_step": predicted_bytes_per_step(name, memory_model.param_bytes,
                                                                          world_size)})
    return {"model": model_name, "world_size": world_size, "batch_size_per_rank": batch_size,
            "optimizer": optimizer, "num_params": count_parameters(model), "dtype": "float32", "ranks": rows}


def run(args: argparse.Namespace) -> int:
    """Predict and print."""
    if args.world_size > MAX_WORLD_SIZE:
        raise ValueError(f"--world-size {args.world_size} is more than {MAX_WORLD_SIZE}")
    if args.batch_size > MAX_BATCH:
        raise ValueError(f"--batch-size {args.batch_size} is more than {MAX_BATCH}")
    report = per_rank_report(args.model, args.world_size, args.strategy, args.batch_size, args.optimizer)
    if args.json:
        print_json(report)
        return 0
    print(f"{args.model}: {report['num_params']:,} parameters, float32, {args.optimizer}, batch {args.batch_size} "
          f"per rank, world_size {args.world_size} (activations measured here; model state by sharding factor)")
    cols = [(k, h, format_bytes) for k, h in (("params_bytes", "params"), ("grads_bytes", "grads"),
                                              ("optimizer_bytes", "optimizer"), ("activations_bytes", "activations"),
                                              ("total_bytes", "total/rank"),
                                              ("zero_paper_mixed_adam_bytes", "ZeRO paper 16-bit Adam"),
                                              ("comm_bytes_sent_per_step", "sent/step"))]
    print(format_table(report["ranks"], [("strategy", "strategy", str)] + cols))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `memory`."""
    p = subparser(sub, "memory", help="per-rank memory of DDP vs ZeRO-1/2/3 and bytes sent per step",
                  description="Per-rank training memory (params, grads, optimizer state, activations) under DDP and "
                              "ZeRO stages 1-3 (Rajbhandari et al. 2020), from the measured memory model with a "
                              "sharding factor, and the bytes each rank sends per step.",
                  examples=["labkit memory --model resnet18 --world-size 4 --strategy zero2 --json",
                            "labkit memory --model small_cnn --world-size 8 --strategy all"])
    p.add_argument("--model", choices=MODELS, default="resnet18", help="model (default resnet18)")
    p.add_argument("--world-size", type=positive_int_arg, default=1, help="number of data-parallel ranks (default 1)")
    p.add_argument("--strategy", choices=("ddp", "zero1", "zero2", "zero3", "all"), default="all",
                   help="sharding strategy, or all (default all)")
    p.add_argument("--batch-size", type=positive_int_arg, default=32, help="micro-batch per rank (default 32)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="optimizer (default adam)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)
