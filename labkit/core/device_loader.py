"""A loader whose batches never leave the device: the whole dataset sits in (GPU) memory and each batch
is one indexing operation there, normalisation included.

On the H100 a DataLoader fed 63-111k samples/s while the same model consumed 768k from GPU-resident
tensors: for a dataset that fits in device memory (CIFAR-10 is 150 MB as uint8), this removes the
input pipeline from the step. Works on CPU too (``device='cpu'``), so CI tests the same path.
"""
from __future__ import annotations

import math
from typing import Iterator, Protocol

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset, TensorDataset


class BatchLoader(Protocol):
    """What ``train()`` reads: a sized iterable of (inputs, labels) batches (DataLoader, DeviceLoader, a list)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


class DeviceLoader:
    """Whole batches indexed from device-resident tensors; a drop-in for a DataLoader in ``train()``."""

    def __init__(self, dataset: Dataset, batch_size: int, *, device: str | torch.device,
                 shuffle: bool = False, drop_last: bool = False, seed: int = 0) -> None:
        self.dataset, self.batch_size, self.device = dataset, batch_size, torch.device(device)
        self.shuffle, self.drop_last, self.seed, self.epoch = shuffle, drop_last, seed, 0
        self._images, self._labels, self._prepare = _device_tensors(dataset, self.device)

    def __len__(self) -> int:
        n = len(self._labels)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _order(self) -> torch.Tensor:
        n = len(self._labels)
        if not self.shuffle:
            return torch.arange(n, device=self.device)
        gen = torch.Generator().manual_seed(self.seed + self.epoch)        # same order on every rerun
        return torch.randperm(n, generator=gen).to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order()
        self.epoch += 1
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            yield self._prepare(self._images[idx]), self._labels[idx]


def _device_tensors(dataset: Dataset, device: torch.device):
    """(inputs, labels, per-batch prepare fn) on ``device`` for the dataset kinds the labs use."""
    indices = None
    if isinstance(dataset, Subset):
        dataset, indices = dataset.dataset, torch.as_tensor(dataset.indices)
    if hasattr(dataset, "images") and hasattr(dataset, "mean"):            # labkit.core.data.ImageTensorDataset
        if getattr(dataset, "transform", None) is not None:
            raise ValueError("make_device_loader cannot apply a per-sample transform; use make_loader for "
                             "augmented data, or load the data without transform=")
        images, labels = dataset.images, dataset.labels
        mean, std = dataset.mean.to(device), dataset.std.to(device)
        size = dataset.image_size

        def prepare(x: torch.Tensor) -> torch.Tensor:
            x = x.float().div_(255.0)
            if size and x.shape[-1] != size:
                x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
            return (x - mean) / std
    elif isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        images, labels = dataset.tensors

        def prepare(x: torch.Tensor) -> torch.Tensor:
            return x
    else:
        raise ValueError(f"make_device_loader needs a labkit image dataset or a TensorDataset(inputs, labels), "
                         f"got {type(dataset).__name__}; use make_loader for other datasets")
    if indices is not None:
        images, labels = images[indices], labels[indices]
    return images.to(device), labels.to(device), prepare
