"""The lab's models: ResNet-18 adapted to 32x32 images, a small CNN and an MLP for fast mode.
The Keras twin of the small CNN, for the TensorFlow labs, is ``labkit.tf.keras.keras_small_cnn``."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from labkit.core.choices import MODELS


def resnet18_cifar(num_classes: int = 10, weights: str | None = None) -> nn.Module:
    """ResNet-18 from torchvision with a 3x3 stem and no max-pool, as usual for 32x32 inputs.

    ``weights="DEFAULT"`` loads ``ResNet18_Weights.DEFAULT`` (ImageNet; needs internet once) for the
    classic transfer-learning recipe; the stem is then replaced, so only later layers keep weights.
    """
    if weights not in (None, "DEFAULT"):
        raise ValueError(f"weights must be None (train from scratch) or 'DEFAULT', got {weights!r}")
    from torchvision.models import ResNet18_Weights, resnet18  # lazy: 1.3 s and ~150 MB a rank building an MLP skips
    if weights:
        try:
            model = resnet18(weights=ResNet18_Weights.DEFAULT)
        except Exception as err:  # noqa: BLE001 - download failures come in many types
            raise RuntimeError("could not fetch ResNet18_Weights.DEFAULT (no internet?); "
                               "use weights=None to train from scratch") from err
        model.fc = nn.Linear(model.fc.in_features, num_classes)
    else:
        model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head: trains in seconds on a CPU."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(2 * width * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of images."""
        return self.head(self.features(x).flatten(1))        # (B, 2w, 4, 4) -> (B, 32w) -> (B, classes)


def mlp_layers(widths: Sequence[int], activation: Callable[[], nn.Module] = nn.ReLU) -> list[nn.Module]:
    """The kit's one MLP: a Linear between each pair of consecutive ``widths``, ``activation()`` after every Linear
    but the last. Built in order, so one seed gives the same weights however the layers are later grouped."""
    if len(widths) < 2:
        raise ValueError(f"an MLP needs at least two widths (inputs, outputs), got {list(widths)}")
    layers: list[nn.Module] = []
    for i, (width_in, width_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(width_in, width_out))
        if i < len(widths) - 2:
            layers.append(activation())
    return layers


def mlp(widths: Sequence[int], activation: Callable[[], nn.Module] = nn.ReLU) -> nn.Sequential:
    """:func:`mlp_layers` as one ``nn.Sequential``."""
    return nn.Sequential(*mlp_layers(widths, activation))


class MLP(nn.Module):
    """Flatten, two hidden layers: the smallest model that still learns the digits."""

    def __init__(self, num_classes: int = 10, in_features: int = 3 * 32 * 32, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), *mlp_layers((in_features, hidden, hidden, num_classes)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of images, flattened first."""
        return self.net(x)


class TransformerBlock(nn.Module):
    """One pre-norm transformer block (Vaswani et al. 2017) over a sequence, mean-pooled to class logits.

    Attention is written as two batched matmuls and a softmax (not fused SDPA), so every matmul is visible
    to ``FlopCounterMode`` and to an operator-by-operator roofline.
    """

    def __init__(self, num_classes: int = 10, d_model: int = 128, n_heads: int = 4, mlp_ratio: int = 4):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(),
                                 nn.Linear(mlp_ratio * d_model, d_model))
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of sequences (B, T, d_model)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.n_heads) ** 0.5, dim=-1)   # (B, H, T, T)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))                       # (B, T, d)
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(dim=1))


def build_model(name: str, num_classes: int = 10, image_shape: tuple[int, int, int] = (3, 32, 32)) -> nn.Module:
    """A lab model by name: 'resnet18', 'small_cnn' or 'mlp'."""
    if name == "resnet18":
        return resnet18_cifar(num_classes)
    if name == "small_cnn":
        return SmallCNN(num_classes, in_channels=image_shape[0])
    if name == "mlp":
        c, h, w = image_shape
        return MLP(num_classes, in_features=c * h * w)
    raise ValueError(f"unknown model {name!r}; choose one of {MODELS}")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def check_model_accepts(model: nn.Module, image_shape: tuple[int, ...], num_classes: int | None = None) -> None:
    """Run one sample through ``model`` and raise a clear ValueError if the shapes do not fit."""
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(1, *image_shape, device=device))
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ValueError(f"{type(model).__name__} does not accept inputs of shape {tuple(image_shape)}: {first}. "
                         "Build the model for this data's image shape (see labkit.core.models.build_model)") from None
    finally:
        model.train(was_training)
    if num_classes is not None and out.shape[-1] != num_classes:
        raise ValueError(f"{type(model).__name__} outputs {out.shape[-1]} classes but the data has {num_classes}")
