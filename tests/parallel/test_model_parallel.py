"""Model parallelism: the split, memory per stage, the GPipe schedule and a real two-process pipeline."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.parallel import model_parallel as mp


def test_split_model_equals_the_whole():
    cfg = mp.SplitConfig(in_features=16, hidden=8, layers_per_stage=2)
    stages = mp.build_stages(cfg)
    whole = torch.nn.Sequential(*[layer for s in mp.build_stages(cfg) for layer in s])
    devices, note = mp.stage_devices(2)
    split = mp.SplitModel(stages, devices)
    x = torch.randn(5, 16)
    torch.testing.assert_close(split(x).cpu(), whole(x))
    assert isinstance(note, str) and note
    with pytest.raises(ValueError, match="one device per stage"):
        mp.SplitModel(stages, devices[:1])


def test_memory_per_stage_splits_the_whole():
    cfg = mp.SplitConfig(in_features=64, hidden=64)
    mem = mp.memory_per_stage(mp.build_stages(cfg))
    assert sum(mem["per_stage_bytes"]) == mem["whole_bytes"]
    params = sum(p.numel() for s in mp.build_stages(cfg) for p in s.parameters())
    assert mem["whole_bytes"] == 3 * 4 * params                    # params + grads + momentum, fp32
    assert 0.5 <= mem["max_share"] < 0.52                         # balanced stages: half each


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 16), f=st.floats(0.1, 5.0), ratio=st.floats(0.5, 3.0))
def test_simulated_bubble_equals_gpipe_formula(p, m, f, ratio):
    events = mp.simulate_gpipe([f] * p, [f * ratio] * p, m)
    assert len(events) == 2 * p * m
    assert mp.bubble_fraction(events, p) == pytest.approx(mp.predicted_bubble(p, m), abs=1e-9)


def test_unequal_stages_bubble_more_and_naive_split_idles():
    assert mp.predicted_bubble(2, 1) == 0.5                        # naive split: one of two stages idle
    balanced = mp.bubble_fraction(mp.simulate_gpipe([1, 1], [2, 2], 4), 2)
    skewed = mp.bubble_fraction(mp.simulate_gpipe([1, 3], [2, 6], 4), 2)
    assert skewed > balanced
    with pytest.raises(ValueError):
        mp.predicted_bubble(0, 1)
    with pytest.raises(ValueError):
        mp.simulate_gpipe([1.0], [1.0, 2.0], 2)


def test_real_two_process_pipeline_structure():
    cfg = mp.SplitConfig(in_features=32, hidden=32)
    points = mp.measure_pipeline((1, 2), batch=8, repeats=1, cfg=cfg, timeout_s=120)
    assert [p.micro_batches for p in points] == [1, 2]
    for p in points:
        assert 0.0 <= p.measured < 1.0 and 0.0 <= p.simulated < 1.0 and p.makespan_s > 0
        assert p.predicted == mp.predicted_bubble(2, p.micro_batches)


def test_micro_batches_for_bubble_and_the_rule():
    assert mp.micro_batches_for_bubble(2, 0.2) == 4            # 1/(4+1) = 0.2
    assert mp.micro_batches_for_bubble(4, 0.1) == 27           # 3/(27+3) = 0.1
    big = mp.recommend_parallelism(300, 100, 0.01, 0.001, 4)
    assert big.choice.startswith("model parallel") and ">= 3 stages" in big.reason
    assert mp.recommend_parallelism(50, 100, 0.01, 0.001, 4).choice == "data parallel"
    assert mp.recommend_parallelism(50, 100, 0.01, 0.05, 4).choice == "one device"
    with pytest.raises(ValueError):
        mp.micro_batches_for_bubble(2, 1.0)


def test_pipeline_timing_noise():
    steady = mp.simulate_gpipe([1.0, 1.0], [2.0, 2.0], 4)
    assert mp.pipeline_timing_noise(steady) == pytest.approx(1.0)
    jittery = steady + [mp.Event(0, 9, "F", 0.0, 5.0)]
    assert mp.pipeline_timing_noise(jittery) > 1.5


def test_pipeline_cpu_share():
    evs = [mp.Event(0, 0, "F", 0.0, 2.0, 1.0), mp.Event(1, 0, "F", 2.0, 4.0, 2.0)]
    assert mp.pipeline_cpu_share(evs) == pytest.approx(0.75)
