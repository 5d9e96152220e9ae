"""The largest-batch finder: mocked OOM on CPU, the memory-model budget, the search from a hint."""
import math

import pytest
import torch
from torch import nn

from labkit.core.models import MLP, build_model
from labkit.memory.model import build_memory_model
from labkit.training.finder import find_max_batch, search_from_hint, search_largest

SHAPE = (3, 8, 8)


class OomAbove(nn.Module):
    """A small model that raises torch.cuda.OutOfMemoryError for batches larger than ``limit``."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.net = limit, MLP(10, in_features=3 * 8 * 8, hidden=8)

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (mocked)")
        return self.net(x)


@pytest.mark.parametrize("limit", [1, 7, 33, 64, 100])
def test_search_finds_exact_threshold(limit):
    tried = []
    got = search_largest(lambda n: tried.append(n) or n <= limit, 1, 128)
    assert got == limit and len(tried) <= 2 * math.ceil(math.log2(128)) + 1
    assert search_largest(lambda n: False) == 0 and search_largest(lambda n: True, 1, 100) == 100


def test_mocked_oom_finder_restores_state_and_process_stays_usable():
    torch.manual_seed(0)
    model = OomAbove(23)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, *SHAPE)).sum().backward()
    opt.step()                                                # optimizer has momentum state now
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mom_before = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    res = find_max_batch(model, SHAPE, optimizer=opt, method="oom", timing_steps=1, limit=256)
    assert res.max_batch == 23 and res.method == "cuda-oom"
    fits = {t.batch_size: t.fits for t in res.trials}
    assert fits[23] and not fits[24]                          # the answer fits, the next size up does not
    assert all(t.samples_per_s > 0 for t in res.trials if t.fits)
    assert all(t.samples_per_s is None and t.note == "out of memory" for t in res.trials if not t.fits)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(a, opt.state[p]["momentum_buffer"]) for a, p in zip(mom_before, model.parameters()))
    assert model(torch.randn(8, *SHAPE)).shape == (8, 10)    # still usable after the OOMs
    assert len(res.to_dataframe()) == len(res.trials)


def test_cpu_budget_finder_uses_memory_model():
    model = MLP(10, in_features=3 * 8 * 8, hidden=32)
    mm = build_memory_model(model, SHAPE, "sgd", 0.9)
    budget = mm.predict(40).total_bytes + 10                  # 40 fits exactly without a margin
    res = find_max_batch(model, SHAPE, memory_budget_bytes=budget, safety_margin=0.0, timing_steps=1)
    assert res.method == "memory-model" and res.max_batch == 40
    assert mm.predict(res.max_batch).total_bytes <= budget < mm.predict(res.max_batch + 1).total_bytes
    res_m = find_max_batch(model, SHAPE, memory_budget_bytes=budget, safety_margin=0.2, timing_steps=0)
    assert res_m.max_batch < 40 and mm.predict(res_m.max_batch).total_bytes <= budget * 0.8


def test_finder_bad_inputs():
    model = MLP(10, in_features=3 * 8 * 8, hidden=32)
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        find_max_batch(model, SHAPE)
    with pytest.raises(ValueError, match="less than the parameters"):
        find_max_batch(model, SHAPE, memory_budget_bytes=1000)
    with pytest.raises(ValueError, match="safety_margin"):
        find_max_batch(model, SHAPE, memory_budget_bytes=10**9, safety_margin=1.5)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"sample_shape": (1, 8, 8)}, ValueError, r"MLP does not accept inputs of shape \(1, 8, 8\)"),
    ({"sample_shape": 192}, ValueError, "sample_shape must be one sample's shape"),
    ({"sample_shape": (3, 8, 8), "start": 100, "limit": 64}, ValueError, "start=100 is above the largest batch"),
    ({"sample_shape": (3, 8, 8), "num_classes": 7}, ValueError, "outputs 10 classes but the data has 7"),
])
def test_finder_misuse_is_one_line_before_any_trial(kwargs, error, words, monkeypatch):
    import labkit.training.finder as finder

    monkeypatch.setattr(finder, "_StepRunner", lambda *a, **k: pytest.fail("a trial ran before the check"))
    with pytest.raises(error, match=words) as err:
        find_max_batch(MLP(10, in_features=3 * 8 * 8, hidden=32), memory_budget_bytes=10**9, **kwargs)
    assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        find_max_batch("resnet18", SHAPE, memory_budget_bytes=10**9)


# ---------------------------------------------------------------- issue 14: the finder on a big GPU
@pytest.mark.parametrize("boundary, hint", [(23, 1), (23, 500), (300, 64), (1, 8), (0, 4)])
def test_search_from_hint_lands_on_the_boundary(boundary, hint):
    tried = []
    got = search_from_hint(lambda n: tried.append(n) or n <= boundary, hint, 1 << 20)
    assert got == boundary
    if boundary:
        assert boundary in tried and boundary + 1 in tried       # confirmed: it fits, the next does not


def test_unbounded_oom_search_runs_until_a_real_failure():
    """80 GB case: no 4096/8192 ceiling; the search stops only when a step runs out of memory."""
    model = OomAbove(5000)
    res = find_max_batch(model, SHAPE, method="oom", timing_steps=0)
    assert res.max_batch == 5000 and res.boundary_confirmed and res.stopped_by == "memory"
    assert "5001 does not" in res.summary()


def test_oom_search_starts_from_the_memory_model_and_confirms():
    """With a budget the CUDA path starts at the model's prediction; a wrong prediction still ends at the truth."""
    model = OomAbove(23)
    res = find_max_batch(model, SHAPE, method="oom", timing_steps=0, memory_budget_bytes=10**9)
    assert res.max_batch == 23 and res.boundary_confirmed
    assert len(res.trials) <= 2 * math.ceil(math.log2(10**6)) + 2


def test_finder_never_claims_more_than_the_dataset():
    res = find_max_batch(OomAbove(10_000), SHAPE, method="oom", timing_steps=0, dataset_size=1797)
    assert res.max_batch == 1797 and res.stopped_by == "dataset" and not res.boundary_confirmed
    assert res.summary().startswith("all 1797 samples of the dataset fit in one batch")
    capped = find_max_batch(OomAbove(10_000), SHAPE, method="oom", timing_steps=0, limit=64)
    assert capped.stopped_by == "limit" and capped.summary().startswith("at least 64 fits")


def test_finder_models_the_runs_own_optimizer():
    from labkit.memory.model import optimizer_settings

    model = MLP(10, in_features=3 * 8 * 8, hidden=32)
    assert optimizer_settings(torch.optim.AdamW(model.parameters())) == ("adam", 0.0)
    assert optimizer_settings(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)) == ("sgd", 0.5)
    with pytest.raises(ValueError, match="SGD and Adam"):
        optimizer_settings(torch.optim.RMSprop(model.parameters()))
    budget = 3 * 10**6
    sgd = find_max_batch(model, SHAPE, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         memory_budget_bytes=budget, timing_steps=0)
    adam = find_max_batch(model, SHAPE, optimizer=torch.optim.Adam(model.parameters()),
                          memory_budget_bytes=budget, timing_steps=0)
    assert adam.max_batch < sgd.max_batch                      # Adam's two state copies leave less for activations


def test_the_finder_makes_the_runs_optimizer_and_refuses_a_name_it_does_not_know(monkeypatch):
    """One way to name an optimizer: the run's (or the name given) is built by RunSpec; 'rmsprop' used to train
    SGD silently."""
    import labkit.training.finder as finder
    from labkit.training.run_spec import RunSpec

    seen = []
    monkeypatch.setattr(finder, "_StepRunner", lambda model, opt, *a: seen.append(opt) or pytest.fail("stop"))
    model = MLP(10, in_features=3 * 8 * 8, hidden=32)
    with pytest.raises(pytest.fail.Exception):
        find_max_batch(model, SHAPE, memory_budget_bytes=10**9, run=RunSpec(optimizer="adam", lr=0.01))
    assert isinstance(seen[-1], torch.optim.Adam) and seen[-1].param_groups[0]["lr"] == 0.01
    with pytest.raises(pytest.fail.Exception):
        find_max_batch(model, SHAPE, memory_budget_bytes=10**9, optimizer_name="sgd", momentum=0.5)
    assert isinstance(seen[-1], torch.optim.SGD) and seen[-1].param_groups[0]["momentum"] == 0.5
    with pytest.raises(ValueError, match="optimizer must be one of"):
        find_max_batch(model, SHAPE, memory_budget_bytes=10**9, optimizer_name="rmsprop")


def test_finder_takes_a_memory_model_already_built(monkeypatch):
    """memory_model=: the same answer as probing again, without a second probe; a model's for another model or
    optimizer is refused."""
    import labkit.training.finder as finder_module

    model = MLP(10, in_features=3 * 8 * 8, hidden=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mm = build_memory_model(model, SHAPE, "sgd", 0.9)
    budget = mm.predict(40).total_bytes + 10
    probed = find_max_batch(model, SHAPE, optimizer=opt, memory_budget_bytes=budget, safety_margin=0.0, timing_steps=0)
    monkeypatch.setattr(finder_module, "build_memory_model", lambda *a, **k: pytest.fail("probed again"))
    given = find_max_batch(model, SHAPE, optimizer=opt, memory_budget_bytes=budget, safety_margin=0.0,
                           timing_steps=0, memory_model=mm)
    assert given.max_batch == probed.max_batch == 40 and given.trials == probed.trials
    with pytest.raises(ValueError, match="built for optimizer 'sgd_momentum'.*'adam'"):
        find_max_batch(model, SHAPE, optimizer=torch.optim.Adam(model.parameters()), memory_budget_bytes=budget,
                       memory_model=mm)
    with pytest.raises(ValueError, match="parameters, the model has"):
        find_max_batch(MLP(10, in_features=3 * 8 * 8, hidden=16), SHAPE, memory_budget_bytes=budget, memory_model=mm)


@pytest.mark.parametrize("budget", [-5, 0, "2G"])
def test_a_budget_that_is_not_a_positive_number_of_bytes_is_one_line(budget):
    model = build_model("small_cnn", 10, (1, 8, 8))
    with pytest.raises(ValueError, match=r"^memory_budget_bytes must be a number > 0, got .*; bytes, e.g. 2 \* 1024\*\*3$"):
        find_max_batch(model, (1, 8, 8), memory_budget_bytes=budget, limit=64)
