"""Shared pieces of the `labkit` subcommands: argument types, tables, JSON and progress bars.

Argument types raise ``argparse.ArgumentTypeError`` so a bad value is one clear line and exit status 2.
Tables and JSON go to stdout; progress bars go to stderr, so ``--json`` output stays machine-readable.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from labkit.core.choices import DATASETS, MODELS
from labkit.core.envcheck import writable_place_problem
from labkit.core.rundirs import RUN_DIR_ENV_VAR, run_path
from labkit.core.validation import checked_int

if TYPE_CHECKING:
    from torch import nn

    from labkit.core.data import ImageData

BYTE_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
              "G": 2**30, "GB": 2**30, "GIB": 2**30}
Column = tuple[str, str, Callable[[Any], str]]  # (row key, header with unit, formatter)


def _int_at_least(text: str, minimum: int, wanted: str) -> int:
    """Parse ``text``, then hold it to the kit's one integer rule (:func:`labkit.core.validation.checked_int`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    try:
        return checked_int(value, "the value", minimum=minimum)  # type: ignore[return-value]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}") from None


def positive_int_arg(text: str) -> int:
    """argparse type: an integer >= 1 (the rule of :func:`labkit.core.validation.positive_int`)."""
    return _int_at_least(text, 1, "a positive integer (1, 2, 3, ...)")


def nonnegative_int_arg(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _require_commas(text: str, parse_one: Callable[[str], Any]) -> None:
    """Refuse other separators ('16 32', '16;32') with the comma form, when every piece is itself valid."""
    pieces = [piece for piece in re.split(r"[\s,;]+", text) if piece]
    if len(pieces) > len([part for part in text.split(",") if part.strip()]):
        try:
            [parse_one(piece) for piece in pieces]
        except argparse.ArgumentTypeError:
            return  # a bad piece: its own message says what is wrong with it
        raise argparse.ArgumentTypeError(f"give the numbers separated by commas, e.g. {','.join(pieces)}; "
                                         f"got {text!r}")


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers, e.g. ``16,32,64``."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers like 16,32,64, got {text!r}")
    _require_commas(text, positive_int_arg)
    return [positive_int_arg(item) for item in items]


def parse_bytes(text: str) -> int:
    """argparse type: a size in bytes with an optional binary unit: ``4096``, ``64K``, ``1M``, ``2GiB``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"expected a size like 4096, 64K, 1M or 2G (binary units), got {text!r}")
    exact = float(match.group(1)) * BYTE_UNITS[unit]
    if exact != int(exact):   # "1.5" would silently become 1 byte; "1.5K" = 1536 bytes is whole, so it is fine
        raise argparse.ArgumentTypeError(f"a size must be a whole number of bytes, got {text!r} = {exact:g} bytes; "
                                         "write a whole number, or a unit that makes it whole (1.5K = 1536)")
    value = int(exact)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return value


def byte_list(text: str) -> list[int]:
    """argparse type: comma-separated sizes, e.g. ``1K,64K,1M``."""
    items = [part for part in text.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes like 1K,64K,1M, got {text!r}")
    _require_commas(text, parse_bytes)
    return [parse_bytes(item) for item in items]


def device_name(text: str) -> str:
    """argparse type: 'cpu', 'cuda' or 'cuda:N' that exists on this machine."""
    import torch

    from labkit.core.device import get_device

    try:
        dev = get_device(text)
    except (ValueError, RuntimeError) as err:
        raise argparse.ArgumentTypeError(str(err).split("\n")[0]) from None
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return str(dev)


def format_bytes(n: float | None) -> str:
    """Bytes with a binary unit: 512 B, 64 KiB, 1.5 MiB."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(n)} B"


def fmt(spec: str) -> Callable[[Any], str]:
    """A cell formatter from a format spec that prints None/NaN as 'n/a'."""
    def apply(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        return format(value, spec)
    return apply


def format_table(rows: Sequence[dict], columns: Sequence[Column], title: str | None = None) -> str:
    """A plain-text table: headers (with units), right-aligned numbers, one line per row."""
    cells = [[formatter(row.get(key)) for key, _, formatter in columns] for row in rows]
    headers = [header for _, header, _ in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [title] if title else []
    lines.append("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def jsonable(value: Any) -> Any:
    """Plain JSON data from dataclasses, numpy values, paths and floats (NaN/inf become null)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def print_json(value: Any) -> None:
    """Print `value` as strict JSON (no NaN) on stdout."""
    print(json.dumps(jsonable(value), indent=2))


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """--json and --no-progress, shared by every measuring subcommand."""
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar (shown on stderr)")


def results_file(text: str | None, *default: str) -> Path:
    """``--results`` (default: run_path(*default)) if it can be written, else one ValueError before any work."""
    path = Path(text).expanduser() if text else run_path(*default)
    where = "--results" if text else f"the default results file (under {RUN_DIR_ENV_VAR} or runs/)"
    if path.is_dir():
        raise ValueError(f"{where} {path} is a folder; give a file name, e.g. --results runs/rows.jsonl")
    why = writable_place_problem(path.parent)
    if why:
        raise ValueError(f"{where} {path}: its folder {why}; give a --results file you can write")
    return path


def add_results_flag(parser: argparse.ArgumentParser, default: str) -> None:
    """--results FILE: where each finished row is saved as it finishes (JSON lines)."""
    parser.add_argument("--results", default=None, help="JSON-lines file each finished row is saved to at once "
                        f"(default: {default} at the repository root, or under ${RUN_DIR_ENV_VAR})")


def add_model_flags(parser: argparse.ArgumentParser, default_model: str = "small_cnn") -> None:
    """--model, --dataset, --device, --seed: what to train and where."""
    parser.add_argument("--model", choices=MODELS, default=default_model,
                        help=f"model to train (default {default_model})")
    parser.add_argument("--dataset", choices=DATASETS, default="auto",
                        help="dataset: auto = CIFAR-10 if cached or downloadable, else the offline digits")
    parser.add_argument("--device", type=device_name, default=None,
                        help="cpu, cuda or cuda:N (default: first GPU, else CPU)")
    parser.add_argument("--seed", type=nonnegative_int_arg, default=0, help="random seed (default 0)")


def subparser(sub: argparse._SubParsersAction, name: str, *, help: str, description: str,
              examples: Sequence[str]) -> argparse.ArgumentParser:
    """A subcommand parser whose --help ends with worked examples."""
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples)
    return sub.add_parser(name, help=help, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def load_workload(args: argparse.Namespace, train_limit: int | None = None) -> tuple[ImageData, nn.Module]:
    """The dataset and model chosen by --dataset/--model/--seed (the notebooks' loaders and models)."""
    from labkit.core.data import load_data
    from labkit.core.env import seed_everything
    from labkit.core.models import build_model

    seed_everything(args.seed)
    data = load_data(None if args.dataset == "auto" else args.dataset, train_limit=train_limit, seed=args.seed)
    return data, build_model(args.model, data.num_classes, data.image_shape)
