"""Image-classification data for the labs: CIFAR-10 when it can be had, real digits offline.

The fallback is *real* data (handwritten digits shipped in ``data/``), so accuracy lessons stay
honest without internet. Synthetic tensors exist only for throughput and profiling labs and say so.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import gzip
import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import CIFAR10

from labkit.core.device_loader import DeviceLoader
from labkit.core.choices import DATASETS
from labkit.core.machine import cpu_count
from labkit.core.manifest import ManifestError, read_manifest
from labkit.core.validation import checked_int, positive_int

REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DATA_DIR_ENV_VAR = "LABKIT_DATA_DIR"
DATA_DIR = Path(os.environ.get(DATA_DIR_ENV_VAR, REPO_DATA_DIR))
DATASET_ENV_VAR = "LABKIT_DATASET"
OFFLINE_ENV_VAR = "LABKIT_OFFLINE"
CIFAR10_HOST = "www.cs.toronto.edu"
DIGITS_FILE = "digits.csv.gz"   # the offline dataset shipped in data/ (listed in data/manifest.json)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


class DataUnavailableError(RuntimeError):
    """A dataset that was asked for cannot be loaded here (e.g. offline); the message says what to do."""


# ---------------------------------------------------------------------------- validation
def validate_batch_size(batch_size: object, dataset_len: int | None = None, name: str = "batch_size") -> int:
    """Return ``batch_size`` as an int, or raise one clear ValueError naming the allowed values."""
    if dataset_len is None:
        return positive_int(batch_size, name)
    return positive_int(batch_size, name, maximum=dataset_len,
                        hint=f"it cannot be larger than the dataset ({dataset_len} samples)")


def max_num_workers() -> int:
    """The most loader workers that can help: 4x the CPU count (beyond it only start-up time and memory grow)."""
    return 4 * cpu_count()


def validate_num_workers(num_workers: object) -> int:
    """Return ``num_workers`` as an int in [0, 4 x CPUs] or raise one clear ValueError."""
    return checked_int(num_workers, "num_workers", minimum=0, maximum=max_num_workers(),
                       hint=f"0 loads in the main process; this machine has {cpu_count()} CPUs, and more workers than "
                            f"4x that only add start-up time and memory")


def check_data_dir(data_dir: Path) -> Path:
    """``data_dir`` if it holds the kit's manifest, else one DataUnavailableError that says what to do."""
    data_dir = Path(data_dir)
    if (data_dir / "manifest.json").is_file():
        return data_dir
    from_env = os.environ.get(DATA_DIR_ENV_VAR)
    source = f" (from {DATA_DIR_ENV_VAR}={from_env})" if from_env and Path(from_env) == data_dir else ""
    what = ("does not exist" if not data_dir.exists() else "has a folder named manifest.json where the file belongs"
            if (data_dir / "manifest.json").exists() else "has no manifest.json")
    raise DataUnavailableError(f"data folder {data_dir}{source} {what}; point {DATA_DIR_ENV_VAR} at a copy of "
                               f"the kit's data folder ({REPO_DATA_DIR}), or unset it to use that folder")


def _restore_hint(filename: str, data_dir: Path) -> str:
    """How to get a good copy back: git for the repo's own data/, a copy from it for any other folder."""
    if data_dir.resolve() == REPO_DATA_DIR.resolve():
        return f"restore it with `git -C {REPO_DATA_DIR.parent} checkout -- data/{filename}`"
    return f"copy the kit's good one over it: `cp {REPO_DATA_DIR / filename} {data_dir / filename}`"


# ---------------------------------------------------------------------------- files under data/
def verify_data_file(filename: str, data_dir: Path | None = None) -> Path:
    """Path of a file under ``data/`` after checking its SHA-256 against ``data/manifest.json``."""
    data_dir = check_data_dir(Path(data_dir or DATA_DIR))
    try:
        manifest = read_manifest(data_dir)
    except ManifestError as err:
        raise DataUnavailableError(str(err)) from None
    if filename not in manifest:
        raise DataUnavailableError(f"{filename} is not listed in {data_dir / 'manifest.json'}; "
                                   "list it there with source, licence and sha256")
    path = data_dir / filename
    if not path.exists():
        raise DataUnavailableError(f"{path} is missing; {_restore_hint(filename, data_dir)}")
    if path.is_dir():
        raise DataUnavailableError(f"{path} is a folder where the data file belongs; remove it and "
                                   f"{_restore_hint(filename, data_dir)}")
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as err:
        raise DataUnavailableError(f"cannot read {path} ({err.strerror or type(err).__name__}); "
                                   f"{_restore_hint(filename, data_dir)}") from None
    if digest != manifest[filename]["sha256"]:
        raise DataUnavailableError(f"{path} fails its checksum (sha256 {digest[:12]}..., expected "
                                   f"{manifest[filename]['sha256'][:12]}...); {_restore_hint(filename, data_dir)}")
    return path


def cifar10_cached(root: Path | None = None) -> bool:
    """True when torchvision's CIFAR-10 files are already under ``root`` (default ``data/``)."""
    return (Path(root or DATA_DIR) / "cifar-10-batches-py" / "data_batch_1").exists()


def can_reach(host: str = CIFAR10_HOST, port: int = 443, timeout_s: float = 3.0) -> bool:
    """True when a TCP connection to host:port opens within the timeout (DNS included)."""
    if os.environ.get(OFFLINE_ENV_VAR, "").strip() not in ("", "0"):
        return False

    def connect() -> bool:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(connect).result(timeout=timeout_s + 1)
    except Exception:  # noqa: BLE001 - any failure means "offline"
        return False
    finally:
        pool.shutdown(wait=False)


def resolve_dataset(name: str | None = None, root: Path | None = None) -> tuple[str, str]:
    """Which dataset ``name`` ('auto' by default, or $LABKIT_DATASET) means here, and why."""
    if name is not None and not isinstance(name, str):
        raise ValueError(f"dataset name must be a string, one of {DATASETS}, got {name!r} ({type(name).__name__})")
    name = (name or os.environ.get(DATASET_ENV_VAR) or "auto").strip().lower()
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {DATASETS}")
    if name != "auto":
        return name, "asked for by name"
    if cifar10_cached(root):
        return "cifar10", f"CIFAR-10 found in {Path(root or DATA_DIR)}"
    if can_reach():
        return "cifar10", f"CIFAR-10 not cached; it will be downloaded from {CIFAR10_HOST} into data/"
    return "digits", "CIFAR-10 not cached and no internet: using the real handwritten digits in data/"


# ---------------------------------------------------------------------------- datasets
class ImageTensorDataset(Dataset):
    """uint8 images (N, C, H, W) kept compact in memory, normalised per sample on access."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 image_size: int | None = None, transform: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        self.images, self.labels = images, labels.long()
        self.mean, self.std = mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)
        self.image_size, self.transform = image_size, transform

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device: str | torch.device) -> "ImageTensorDataset":
        """The same dataset with its tensors on ``device`` (for make_device_loader; index it on that device)."""
        dev = torch.device(device)
        return ImageTensorDataset(self.images.to(dev), self.labels.to(dev), self.mean.to(dev), self.std.to(dev),
                                  self.image_size, self.transform)

    def _prepare(self, idx: torch.Tensor | list[int]) -> torch.Tensor:
        x = self.images[idx].float().div_(255.0)                      # (B, C, H, W) in [0, 1]
        if self.image_size and x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        return (x - self.mean) / self.std

    def __getitem__(self, i: int):
        x = self._prepare([int(i)])[0]
        if self.transform is not None:
            x = self.transform(x)
        return x, self.labels[i]

    def __getitems__(self, indices: list[int]):
        """Batched fetch (used by DataLoader): one vectorised normalisation for the whole batch."""
        if self.transform is not None:
            return [self[i] for i in indices]
        xs = self._prepare(list(indices))
        return list(zip(xs, self.labels[indices]))


@dataclass(frozen=True)
class ImageData:
    """A train/validation pair and what it is."""

    name: str
    description: str
    train: Dataset
    val: Dataset
    num_classes: int
    image_shape: tuple[int, int, int]
    synthetic: bool = False

    def __str__(self) -> str:
        kind = "SYNTHETIC (throughput only)" if self.synthetic else "real"
        return (f"{self.name}: {len(self.train)} train / {len(self.val)} val images of shape "
                f"{self.image_shape}, {self.num_classes} classes, {kind} — {self.description}")


def _limit(n: int, limit: int | None, seed: int) -> torch.Tensor:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm if limit is None else perm[: min(limit, n)]


def _channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = images.float().div(255.0)
    return x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3)).clamp_min(1e-3)


def _load_digits(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    raw = np.loadtxt(gzip.open(verify_data_file(DIGITS_FILE, data_dir)), delimiter=",")
    pixels = torch.tensor(raw[:, :-1], dtype=torch.float32).view(-1, 1, 8, 8) * (255.0 / 16.0)
    big = F.interpolate(pixels, size=(32, 32), mode="bilinear", align_corners=False)  # (N, 1, 32, 32)
    images = big.clamp(0, 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    return images, torch.tensor(raw[:, -1], dtype=torch.long)


Split = tuple[torch.Tensor, torch.Tensor]            # (uint8 images (N, C, H, W), int64 labels (N,))


def _load_cifar10(root: Path, download: bool) -> tuple[Split, Split]:
    try:
        parts = [CIFAR10(str(root), train=t, download=download) for t in (True, False)]
    except Exception as err:  # noqa: BLE001 - network and file errors alike
        raise DataUnavailableError(
            f"CIFAR-10 is not in {root} and could not be downloaded ({type(err).__name__}). "
            "Run once with internet, or copy cifar-10-python.tar.gz into data/, or use dataset='digits'") from None
    return tuple((torch.from_numpy(p.data).permute(0, 3, 1, 2).contiguous(), torch.tensor(p.targets)) for p in parts)


def synthetic_data(n_train: int = 512, n_val: int = 128, image_shape: tuple[int, int, int] = (3, 32, 32),
                   num_classes: int = 10, seed: int = 0) -> ImageData:
    """Random images with random labels: for throughput/profiling only, never for accuracy."""
    g = torch.Generator().manual_seed(seed)
    sets = []
    for n in (n_train, n_val):
        images = torch.randint(0, 256, (n, *image_shape), dtype=torch.uint8, generator=g)
        sets.append(ImageTensorDataset(images, torch.randint(0, num_classes, (n,), generator=g),
                                       torch.full((image_shape[0],), 0.5), torch.full((image_shape[0],), 0.29)))
    return ImageData("synthetic", "random pixels and labels (throughput/profiling only)", sets[0], sets[1],
                     num_classes, image_shape, synthetic=True)


def load_data(name: str | None = None, *, image_size: int = 32, train_limit: int | None = None,
              val_limit: int | None = None, seed: int = 0, root: Path | None = None,
              transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
              device: str | torch.device | None = None) -> ImageData:
    """Load the lab's dataset ('auto': CIFAR-10 if cached or downloadable, else real digits offline).

    ``device`` puts the (uint8) tensors on that device once, for :func:`make_device_loader`.
    """
    data = _load_data(name, image_size, train_limit, val_limit, seed, root, transform)
    if device is None:
        return data
    return dataclasses.replace(data, train=data.train.to(device), val=data.val.to(device))


def _load_data(name, image_size, train_limit, val_limit, seed, root, transform) -> ImageData:
    chosen, reason = resolve_dataset(name, root)
    root = Path(root or DATA_DIR)
    checked_int(image_size, "image_size")
    for pname, value in (("train_limit", train_limit), ("val_limit", val_limit)):
        checked_int(value, pname, allow_none=True)
    if chosen == "synthetic":
        return synthetic_data(train_limit or 512, val_limit or 128, (3, image_size, image_size), seed=seed)
    if chosen == "cifar10":
        (xtr, ytr), (xva, yva) = _load_cifar10(root, download=not cifar10_cached(root))
        num_classes, desc = 10, f"CIFAR-10 (Krizhevsky 2009) via torchvision; {reason}"
    else:
        images, labels = _load_digits(check_data_dir(root))
        order = _limit(len(labels), None, seed)                       # fixed shuffled split
        n_val = len(labels) // 5
        xva, yva, xtr, ytr = images[order[:n_val]], labels[order[:n_val]], images[order[n_val:]], labels[order[n_val:]]
        num_classes, desc = 10, f"UCI handwritten digits (Alpaydin & Kaynak 1998), 8x8 upsampled; {reason}"
    tr, va = _limit(len(ytr), train_limit, seed), _limit(len(yva), val_limit, seed + 1)
    xtr, ytr, xva, yva = xtr[tr], ytr[tr], xva[va], yva[va]
    mean, std = _channel_stats(xtr)
    train = ImageTensorDataset(xtr, ytr, mean, std, image_size, transform)
    val = ImageTensorDataset(xva, yva, mean, std, image_size)
    return ImageData(chosen, desc, train, val, num_classes, (3, image_size, image_size))


def make_loader(dataset: Dataset, batch_size: int, *, shuffle: bool = False, num_workers: int = 0,
                pin_memory: bool = False, drop_last: bool = False, prefetch_factor: int | None = None,
                persistent_workers: bool = False, seed: int = 0) -> DataLoader:
    """A DataLoader with validated arguments and a seeded shuffle (same order on every rerun)."""
    batch_size = validate_batch_size(batch_size, len(dataset))
    num_workers = validate_num_workers(num_workers)
    if num_workers == 0 and (prefetch_factor is not None or persistent_workers):
        raise ValueError("prefetch_factor and persistent_workers need num_workers >= 1 "
                         "(they configure worker processes); set num_workers or drop them")
    checked_int(prefetch_factor, "prefetch_factor", allow_none=True)
    extra = {"prefetch_factor": prefetch_factor} if prefetch_factor is not None else {}
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
                      pin_memory=pin_memory and torch.cuda.is_available(), drop_last=drop_last,
                      persistent_workers=persistent_workers, generator=torch.Generator().manual_seed(seed), **extra)


def make_device_loader(dataset: Dataset, batch_size: int, *, device: str | torch.device, shuffle: bool = False,
                       drop_last: bool = False, seed: int = 0) -> DeviceLoader:
    """Batches indexed from tensors held on ``device`` (normalised there too): no workers, no copies per step.

    Has ``__len__``, ``batch_size`` and ``dataset``, so ``train()`` takes it like a DataLoader.
    """
    batch_size = validate_batch_size(batch_size, len(dataset))
    return DeviceLoader(dataset, batch_size, device=device, shuffle=shuffle, drop_last=drop_last, seed=seed)
