"""The hardware ceiling: how fast this model and recipe train when the input pipeline costs nothing.

Synthetic batches are made once, directly on the device, and cycled: no loader, no copy, no decode.
Whatever a real pipeline reaches is a fraction of this number, so it belongs beside every throughput
table (notebook 01, the tuning ladder). Random labels: a throughput instrument, never an accuracy one.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from labkit.validation import positive_int

POOL_BATCHES = 4        # distinct resident batches cycled (a few, so no kernel sees a constant input)


class ResidentBatches:
    """A loader of ``length`` batches cycled from a small pool already on ``device``."""

    def __init__(self, batch_size: int, image_shape: tuple[int, ...], num_classes: int, length: int,
                 device: torch.device, seed: int = 0) -> None:
        gen = torch.Generator(device=device).manual_seed(seed)
        self.batch_size, self.length = batch_size, length
        self.pool = [(torch.randn(batch_size, *image_shape, generator=gen, device=device),
                      torch.randint(0, num_classes, (batch_size,), generator=gen, device=device))
                     for _ in range(min(POOL_BATCHES, length))]

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.length):
            yield self.pool[i % len(self.pool)]


def measure_ceiling(model: nn.Module, batch_size: int, config, *, image_shape: tuple[int, ...],
                    num_classes: int):
    """Train ``model`` for ``config``'s steps on device-resident synthetic batches -> RunResult.

    Uses the same loop, optimizer and precision as a real run (so MFU and the math mode are reported
    alike); only the data path is gone. ``config.evaluate`` is ignored (random labels).
    """
    from dataclasses import replace

    from labkit.env import get_device
    from labkit.loop import train

    batch_size = positive_int(batch_size, "batch_size")
    num_classes = positive_int(num_classes, "num_classes")
    if not isinstance(image_shape, (tuple, list)) or not image_shape:
        raise ValueError(f"image_shape must be a tuple such as (3, 32, 32), got {image_shape!r}")
    for size in image_shape:
        positive_int(size, "each image_shape size", hint=f"image_shape was {tuple(image_shape)!r}")
    device = get_device(config.device)
    steps = config.steps if config.steps is not None else config.epochs
    batches = ResidentBatches(batch_size, tuple(image_shape), num_classes, steps, device, seed=config.seed)
    cfg = replace(config, steps=steps, epochs=None, evaluate=False)
    result = train(model, batches, cfg)
    result.extra["ceiling"] = "synthetic batches resident on the device: no loader, no host-to-device copy"
    return result
