import pytest
import torch

from labkit.core import models
from labkit.core.choices import MODELS


@pytest.mark.parametrize("name", MODELS)
def test_models_map_images_to_logits(name):
    model = models.build_model(name, num_classes=10)
    out = model(torch.zeros(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_resnet18_is_adapted_to_32x32():
    model = models.resnet18_cifar()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)
    assert 11_000_000 < models.count_parameters(model) < 11_300_000


def test_unknown_model_is_clear():
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        models.build_model("vgg")


def test_check_model_accepts_names_the_shape():
    with pytest.raises(ValueError, match=r"does not accept inputs of shape \(3, 64, 64\)"):
        models.check_model_accepts(models.MLP(), (3, 64, 64))
    with pytest.raises(ValueError, match="outputs 10 classes but the data has 5"):
        models.check_model_accepts(models.SmallCNN(), (3, 32, 32), num_classes=5)
    models.check_model_accepts(models.SmallCNN(), (3, 32, 32), num_classes=10)


def test_weights_argument_is_validated():
    with pytest.raises(ValueError, match="weights must be None"):
        models.resnet18_cifar(weights="IMAGENET1K_V9")


def test_one_mlp_builder_for_every_mlp_in_the_kit():
    from torch import nn

    from labkit.core.models import mlp, mlp_layers

    layers = mlp_layers((5, 7, 7, 3), nn.Tanh)
    assert [type(m).__name__ for m in layers] == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
    assert [(m.in_features, m.out_features) for m in layers if isinstance(m, nn.Linear)] == [(5, 7), (7, 7), (7, 3)]
    torch.manual_seed(0)
    a = mlp((5, 7, 3))
    torch.manual_seed(0)
    b = models.MLP(3, in_features=5, hidden=7)
    assert torch.equal(a[0].weight, b.net[1].weight)          # same seed, same draw order, same weights
    with pytest.raises(ValueError, match="at least two widths"):
        mlp((5,))
