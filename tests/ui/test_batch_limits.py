"""The slider's bound: the finder's memory-model answer, powers of two, and a clear 'would not fit by N MB'."""
from types import SimpleNamespace

import pytest
import torch

from labkit.core.models import build_model
from labkit.training.run_spec import RunSpec
from labkit.ui.batch_limits import BatchLimit, batch_limit, capacity_bytes, fit_verdict, power_of_two_batches, \
    slider_labels

SHAPE = (3, 8, 8)
RUN = RunSpec(model="small_cnn", optimizer="sgd", momentum=0.9)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    net = build_model("small_cnn", 10, SHAPE)
    return net, RUN.memory_model(net, SHAPE)


def test_limit_is_the_memory_models_largest_batch(cnn):
    net, mem = cnn
    budget = 8 * 10**6
    lim = batch_limit(net, RUN, mem, SHAPE, device=torch.device("cpu"), cpu_budget_bytes=budget, dataset_size=10**6)
    assert lim.limited_by == "memory" and lim.max_batch == mem.largest_batch_within(budget, 0.1)
    assert mem.predict(lim.max_batch).total_bytes <= lim.usable_bytes < mem.predict(lim.max_batch + 1).total_bytes
    assert lim.capacity_bytes == budget and lim.usable_bytes == int(0.9 * budget)
    sizes = power_of_two_batches(lim)
    assert sizes[0] == 1 and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert sizes[-2] <= lim.max_batch < sizes[-1]            # one size past the limit, to see why it is the limit


def test_a_batch_past_the_limit_says_by_how_much(cnn):
    net, mem = cnn
    lim = batch_limit(net, RUN, mem, SHAPE, device=torch.device("cpu"), cpu_budget_bytes=8 * 10**6, dataset_size=10**6)
    too_big = power_of_two_batches(lim)[-1]
    assert fit_verdict(mem, lim.max_batch, lim) is None
    verdict = fit_verdict(mem, too_big, lim)
    over_mb = (mem.predict(too_big).total_bytes - lim.usable_bytes) / 1e6
    assert f"batch {too_big} would not fit" in verdict and f"{over_mb:,.1f} MB over" in verdict
    assert f"largest that fits is {lim.max_batch}" in verdict


def test_the_dataset_can_be_the_limit(cnn):
    net, mem = cnn
    lim = batch_limit(net, RUN, mem, SHAPE, device=torch.device("cpu"), cpu_budget_bytes=10**9, dataset_size=100)
    assert lim.limited_by == "dataset" and lim.max_batch == 100
    assert power_of_two_batches(lim)[-1] == 64              # nothing past the data is offered
    assert "larger than the dataset" in fit_verdict(mem, 128, lim)


def test_slider_labels_mark_the_knee_the_answer_and_what_does_not_fit():
    lim = BatchLimit(16, 10**6, 9 * 10**5, "memory", "cpu", "")
    labels = dict((v, k) for k, v in slider_labels([1, 2, 4, 8, 16, 32], lim, knee=4))
    assert labels[4] == "4 (knee)" and labels[16] == "16 (largest that fits)" and labels[32] == "32 (won't fit)"
    assert labels[8] == "8"
    odd = BatchLimit(20, 10**6, 9 * 10**5, "memory", "cpu", "")
    assert dict(slider_labels([8, 16, 32], odd, knee=None))["16 (finder: 20 fits)"] == 16


def test_capacity_is_the_card_on_a_gpu_and_the_budget_on_a_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(total_memory=80 * 2**30))
    assert capacity_bytes(torch.device("cuda", 0), None) == 80 * 2**30
    assert capacity_bytes(torch.device("cpu"), 123) == 123
    with pytest.raises(ValueError, match="on a CPU give memory_budget_bytes"):
        capacity_bytes(torch.device("cpu"), None)
    with pytest.raises(ValueError, match="limited_by"):
        BatchLimit(1, 1, 1, "luck", "cpu", "")


def test_the_run_the_memory_model_prices_is_the_run_the_finder_trains(cnn):
    """No optimizer decoded from a kind string with a guessed momentum: a mismatch is one clear error."""
    net, mem = cnn
    assert RUN.memory_model(net, SHAPE).optimizer == "sgd_momentum" == RUN.optimizer_kind
    with pytest.raises(ValueError, match="prices optimizer 'sgd_momentum' but the run trains with 'adam'"):
        batch_limit(net, RUN.replace(optimizer="adam"), mem, SHAPE, device=torch.device("cpu"),
                    cpu_budget_bytes=8 * 10**6, dataset_size=100)
