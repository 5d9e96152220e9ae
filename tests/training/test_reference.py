"""The reference kit: the toy problem, its single-process training and the weight comparison."""
import pytest
import torch

from labkit.training import reference as ref


def test_training_is_deterministic_and_moves_weights():
    a, b = ref.train_single_process(2, steps=4), ref.train_single_process(2, steps=4)
    assert ref.max_weight_difference(a, b) == 0.0
    assert ref.max_weight_difference(a, ref.train_single_process(2, steps=0)) > 1e-3


def test_toy_problem_validates_its_sizes():
    with pytest.raises(ValueError, match=r"^lr must be a number > 0, got 0"):
        ref.ToyProblem(lr=0)
    with pytest.raises(ValueError, match=r"^micro_batch must be an integer >= 1, got 0$"):
        ref.ToyProblem(micro_batch=0)


def test_shard_splits_rows_evenly_or_says_why():
    x = torch.arange(8).reshape(4, 2)
    assert torch.equal(ref.shard(x, 1, 2), x[2:])
    with pytest.raises(ValueError, match="split evenly"):
        ref.shard(torch.zeros(5, 2), 0, 2)


def test_max_weight_difference_keeps_float64_precision_and_checks_keys():
    a = {"w": torch.zeros(3, dtype=torch.float64)}
    b = {"w": torch.tensor([0.0, 1e-12, 0.0], dtype=torch.float64)}
    assert ref.max_weight_difference(a, b) == pytest.approx(1e-12, rel=1e-9)
    with pytest.raises(ValueError, match="different keys"):
        ref.max_weight_difference(a, {"v": torch.zeros(3)})
