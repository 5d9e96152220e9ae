"""Fixtures shared by the ladder's tests: a small synthetic dataset and one ladder climbed with the fakes."""
import pytest

from labkit.core.data import synthetic_data
from labkit.ladder.climb import run_ladder

from tests.ladder.fakes import SHAPE, fake_ceiling, fake_trainer, smoke, tiny_mlp


@pytest.fixture(scope="package")
def data():
    return synthetic_data(n_train=64, n_val=16, image_shape=SHAPE)


@pytest.fixture(scope="package")
def fake_result(data):
    return run_ladder(smoke(measure_ceiling=True), model_fn=tiny_mlp, data=data, trainer=fake_trainer,
                      ceiling_fn=fake_ceiling)
