"""The tuning ladder: one training job, every lesson of the kit switched on rung by rung, each rung measured.

Rungs are cumulative: each is added to the best recipe so far and measured with the instrumented loop
for the same fixed budget of training samples (throughput *and* accuracy). A rung that does not make
the job faster here is still measured and reported ("slower", "no clear gain" or "unsupported here",
with the reason), then left out of the following rungs. Headless: ``python -m labkit ladder`` runs
:func:`ladder_main`, which writes the table as JSON and Markdown.
"""
from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from labkit.ladder_climb import LadderJob, climb
from labkit.ladder_report import LadderResult, LadderRow
from labkit.ladder_rungs import RUNG_KEYS, RUNGS, detect_capabilities
from labkit.models import MODELS

__all__ = ["LadderConfig", "LadderResult", "LadderRow", "RUNGS", "add_ladder_arguments", "ladder_command",
           "ladder_main", "run_ladder"]


@dataclass(frozen=True)
class LadderConfig:
    """What the ladder trains, for how long, and which rungs it may try."""

    model: str = "resnet18"                       # labkit.build_model name (ignored when model_fn is given)
    dataset: str | None = None                    # labkit.load_data name; None -> 'auto'
    train_limit: int | None = None
    val_limit: int | None = None
    budget_epochs: int = 2                        # fixed budget per rung: this many passes over the training set
    lr: float = 0.05                              # SGD LR at lr_ref_batch, scaled linearly (Goyal et al. 2017)
    lr_ref_batch: int = 32
    batch_candidates: tuple[int, ...] = (32, 64, 128, 256)
    probe_steps: int = 5                          # timed steps per candidate when choosing rung 1's batch
    memory_budget_bytes: int | None = None        # CPU memory budget for the batch-size finder
    num_workers: int | None = None                # rung 2; None -> half the cores (1..4)
    ddp_world_size: int | None = None             # rung 7; None -> all GPUs, or 2 gloo processes on a CPU
    skip: tuple[str, ...] = ()                    # rung keys to leave out (reported as "skipped")
    min_gain: float = 0.03                        # a rung is carried forward only if >= 3% faster
    accuracy_tolerance: float = 0.01              # ... and its accuracy within 1 point of rung 1's
    warmup_steps: int = 3                         # excluded from throughput (compile, worker start-up)
    seed: int = 0
    device: str | None = None
    ddp_timeout_s: float = 600.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r} (or pass model_fn= to run_ladder)")
        _positive_ints(self, "budget_epochs", "lr_ref_batch", "probe_steps")
        _positive_ints(self, "train_limit", "val_limit", "memory_budget_bytes", "ddp_world_size", allow_none=True)
        _nonnegative_ints(self, "warmup_steps", "seed")
        if self.num_workers is not None:
            _nonnegative_ints(self, "num_workers")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not self.batch_candidates or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                            for b in self.batch_candidates):
            raise ValueError(f"batch_candidates must be a non-empty tuple of positive integers, "
                             f"got {self.batch_candidates!r}")
        unknown = [k for k in self.skip if k not in RUNG_KEYS]
        if unknown or "naive" in self.skip:
            raise ValueError(f"skip may name rungs {RUNG_KEYS[1:]}, got {self.skip!r} (rung 0 is the baseline)")
        if not 0 <= self.min_gain < 1 or not 0 <= self.accuracy_tolerance <= 1:
            raise ValueError(f"min_gain must be in [0, 1) and accuracy_tolerance in [0, 1], "
                             f"got {self.min_gain!r}, {self.accuracy_tolerance!r}")
        if not self.ddp_timeout_s > 0:
            raise ValueError(f"ddp_timeout_s must be > 0 seconds, got {self.ddp_timeout_s!r}")

    @classmethod
    def fast(cls, **overrides) -> "LadderConfig":
        """CPU-sized (fast mode): the small CNN on the lab's data, 5 epochs per rung, batches up to 64.

        Five epochs bring the digits to a plateau, so rungs that only reorder floating-point work land within
        a point of each other; larger batches would take too few steps on this budget to converge.
        """
        return cls(**{"model": "small_cnn", "budget_epochs": 5, "batch_candidates": (16, 32, 64),
                      "memory_budget_bytes": 1 << 30,                 # Binder's 2 GB, half for the kernel
                      **overrides})

    @classmethod
    def full(cls, **overrides) -> "LadderConfig":
        """GPU-sized (full mode): ResNet-18 on 10,000 training images, 2 epochs per rung."""
        return cls(**{"model": "resnet18", "train_limit": 10_000, "budget_epochs": 2,
                      "batch_candidates": (64, 128, 256, 512), **overrides})

    @classmethod
    def smoke(cls, **overrides) -> "LadderConfig":
        """Seconds-long, for tests: tiny data, two candidates, no compile and no DDP."""
        return cls(**{"model": "small_cnn", "train_limit": 64, "val_limit": 32, "budget_epochs": 1,
                      "batch_candidates": (4, 8), "probe_steps": 2, "warmup_steps": 1,
                      "skip": ("compile", "ddp"), "progress": False, **overrides})

    @classmethod
    def for_mode(cls, mode=None, **overrides) -> "LadderConfig":
        """``fast()`` in fast mode, ``full()`` in full mode."""
        from labkit.env import pick

        return pick(fast=cls.fast, full=cls.full, mode=mode)(**overrides)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LadderConfig":
        """The config the command-line options describe (see :func:`add_ladder_arguments`)."""
        get = lambda name: getattr(args, name, None)  # noqa: E731 - a parser may define only some options
        overrides = {k: v for k, v in {
            "model": get("model"), "dataset": get("dataset"), "train_limit": get("train_limit"),
            "budget_epochs": get("budget_epochs"), "device": get("device"), "ddp_world_size": get("ddp_world_size"),
            "batch_candidates": tuple(get("batch_sizes")) if get("batch_sizes") else None,
            "skip": tuple(get("skip")) if get("skip") else None}.items() if v is not None}
        return cls.for_mode(**overrides)


def _positive_ints(cfg, *names: str, allow_none: bool = False) -> None:
    for name in names:
        v = getattr(cfg, name)
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {v!r}")


def _nonnegative_ints(cfg, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")


def run_ladder(config: LadderConfig | None = None, model_fn: Callable | None = None, data=None, *,
               trainer: Callable | None = None) -> LadderResult:
    """Climb the ladder on one job: measure every rung, carry forward the ones that help, return the table.

    ``model_fn()`` builds a fresh model (default: ``config.model`` via labkit.build_model; must be picklable,
    e.g. a module-level function, for the DDP rung); ``data`` is an ImageData (default: labkit.load_data);
    ``trainer`` replaces labkit.loop.train (tests inject a fake to check the rung logic exactly).
    """
    from labkit.data import load_data, make_loader
    from labkit.env import device_label, get_device, get_mode
    from labkit.models import build_model, check_model_accepts

    config = config or LadderConfig.for_mode()
    name = config.model if model_fn is None else getattr(model_fn, "__name__", type(model_fn).__name__)
    device = get_device(config.device)
    if data is None:
        data = load_data(config.dataset, train_limit=config.train_limit, val_limit=config.val_limit, seed=config.seed)
    model_fn = model_fn or functools.partial(build_model, config.model, data.num_classes, tuple(data.image_shape))
    check_model_accepts(model_fn(), tuple(data.image_shape), data.num_classes)
    caps = detect_capabilities(device, config.ddp_world_size, config.num_workers)
    job = LadderJob(config, model_fn, data, str(device), caps, make_loader(data.val, min(256, len(data.val))),
                    config.budget_epochs * len(data.train), trainer)
    rows, probe, notes = climb(job)
    return LadderResult(rows, device_label(device), str(get_mode()), name, data.name, job.budget_samples,
                        probe, notes)


def add_ladder_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ladder's options to ``parser`` (used by ``python -m labkit ladder``)."""
    parser.add_argument("--out", default="runs/ladder", help="directory for ladder.json and ladder.md")
    parser.add_argument("--model", choices=MODELS, help="model (default: small_cnn in fast mode, resnet18 in full)")
    parser.add_argument("--dataset", help="dataset name for labkit.load_data (default: auto)")
    parser.add_argument("--train-limit", type=int, help="use at most this many training images")
    parser.add_argument("--budget-epochs", type=int, help="fixed training budget per rung, in epochs")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="rung 1's candidate batch sizes")
    parser.add_argument("--skip", nargs="+", choices=RUNG_KEYS[1:], help="rungs to leave out")
    parser.add_argument("--ddp-world-size", type=int, help="processes for the DDP rung (default: all devices)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: the first GPU, else the CPU)")
    return parser


def ladder_command(args: argparse.Namespace) -> int:
    """Run the ladder the parsed options describe; write ladder.json + ladder.md to ``args.out``; print the table."""
    result = run_ladder(LadderConfig.from_args(args))
    json_path, md_path = result.save(getattr(args, "out", None) or "runs/ladder")
    print(result.to_markdown())
    print(f"\nwrote {json_path} and {md_path}")
    return 0


def ladder_main(argv: Sequence[str] | None = None) -> int:
    """``python -m labkit ladder [options]``: the ladder headless; exit 0, or 2 with one line on bad input."""
    parser = add_ladder_arguments(argparse.ArgumentParser(prog="python -m labkit ladder",
                                                          description=__doc__.split("\n\n")[0]))
    args = parser.parse_args(argv)
    try:
        return ladder_command(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(ladder_main())


