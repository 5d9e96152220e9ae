"""The hardware ceiling: how fast this model and recipe train when the input pipeline costs nothing.

A few batches are put on the device once and cycled: no loader, no copy, no decode. Whatever a real
pipeline reaches is a fraction of this number, so it belongs beside every throughput table (notebook 01,
the tuning ladder). Give it real samples (``sample_from=``) where you have them: some kernels run at a
speed that depends on the values (on the 2-core CI box the small CNN's forward takes 14.3 ms on digits and
16.0 ms on random noise, interleaved; max-pooling over many equal values branches predictably), so a
ceiling of noise can sit below a real loader. Without samples the batches are random (shape and classes
only). Either way a throughput instrument, never an accuracy one.

A ceiling is an upper bound, so it is the best of a few repeats: one short run on a shared machine reads
20-30% low as often as not (measured on the 2-core CI box), and a loader would then seem to beat it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import torch
from torch import nn
from torch.utils.data import Dataset

from labkit.core.device import get_device
from labkit.core.device_loader import DeviceLoader
from labkit.core.validation import positive_int
from labkit.training.config import TrainConfig
from labkit.training.loop import RunResult, train

POOL_BATCHES = 4        # distinct resident batches cycled (a few, so no kernel sees a constant input)
CEILING_REPEATS = 3     # runs of which the fastest is the ceiling


class ResidentBatches:
    """A loader of ``length`` batches cycled from a small pool already on ``device``.

    The pool holds the first batches of ``sample_from`` (prepared on the device), or random tensors of
    ``image_shape`` and ``num_classes`` when no samples are given.
    """

    def __init__(self, batch_size: int, image_shape: tuple[int, ...], num_classes: int, length: int,
                 device: torch.device, seed: int = 0, sample_from: Dataset | None = None) -> None:
        self.batch_size, self.length = batch_size, length
        count = min(POOL_BATCHES, length)
        if sample_from is not None:
            self.pool = _real_batches(sample_from, batch_size, count, device)
            return
        gen = torch.Generator(device=device).manual_seed(seed)
        self.pool = [(torch.randn(batch_size, *image_shape, generator=gen, device=device),
                      torch.randint(0, num_classes, (batch_size,), generator=gen, device=device))
                     for _ in range(count)]

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.length):
            yield self.pool[i % len(self.pool)]


def _real_batches(dataset: Dataset, batch_size: int, count: int, device: torch.device) -> list:
    """Up to ``count`` full batches of ``dataset``, prepared and resident on ``device``."""
    if len(dataset) < batch_size:
        raise ValueError(f"sample_from has {len(dataset)} samples, fewer than batch_size={batch_size}; pass a "
                         "larger dataset or leave sample_from=None for random batches")
    batches = iter(DeviceLoader(dataset, batch_size, device=device, drop_last=True))
    return [next(batches) for _ in range(min(count, len(dataset) // batch_size))]


def measure_ceiling(model: nn.Module, batch_size: int, config: TrainConfig, *, image_shape: tuple[int, ...],
                    num_classes: int, repeats: int = CEILING_REPEATS,
                    sample_from: Dataset | None = None) -> RunResult:
    """Train ``model`` for ``config``'s steps on batches already resident on the device -> RunResult.

    Uses the same loop, optimizer and precision as a real run (so MFU and the math mode are reported
    alike); only the data path is gone. ``sample_from`` (a labkit image dataset or a TensorDataset) gives
    real batches to cycle, else they are random; ``config.evaluate`` is ignored. The run is repeated
    ``repeats`` times and the fastest (by median samples/s) is returned; every repeat's median is kept in
    ``extra["repeat_samples_per_s"]``.
    """
    batch_size = positive_int(batch_size, "batch_size")
    repeats = positive_int(repeats, "repeats")
    num_classes = positive_int(num_classes, "num_classes")
    if not isinstance(image_shape, (tuple, list)) or not image_shape:
        raise ValueError(f"image_shape must be a tuple such as (3, 32, 32), got {image_shape!r}")
    for size in image_shape:
        positive_int(size, "each image_shape size", hint=f"image_shape was {tuple(image_shape)!r}")
    device = get_device(config.device)
    steps = config.steps if config.steps is not None else config.epochs
    batches = ResidentBatches(batch_size, tuple(image_shape), num_classes, steps, device, seed=config.spec.seed,
                              sample_from=sample_from)
    cfg = replace(config, steps=steps, epochs=None, evaluate=False)
    runs = [train(model, batches, cfg) for _ in range(repeats)]
    best = max(runs, key=lambda r: r.samples_per_s_median)
    best.extra["repeat_samples_per_s"] = [r.samples_per_s_median for r in runs]
    kind = "real batches" if sample_from is not None else "random batches"
    best.extra["ceiling"] = (f"{kind} resident on the device: no loader, no host-to-device copy; "
                             f"fastest of {repeats} runs")
    return best
