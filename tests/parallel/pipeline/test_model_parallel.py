"""Model parallelism: the split computes the same function, memory per stage, and the rule that chooses."""
import pytest
import torch

from labkit.parallel.pipeline import model_parallel as mp


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


def test_recommend_parallelism_the_rule():
    big = mp.recommend_parallelism(300, 100, 0.01, 0.001, 4)
    assert big.choice.startswith("model parallel") and ">= 3 stages" in big.reason
    assert mp.recommend_parallelism(50, 100, 0.01, 0.001, 4).choice == "data parallel"
    assert mp.recommend_parallelism(50, 100, 0.01, 0.05, 4).choice == "one device"


def test_bad_sizes_are_one_clear_error():
    with pytest.raises(ValueError, match=r"^stages must be an integer >= 1, got 0$"):
        mp.SplitConfig(stages=0)
    with pytest.raises(ValueError, match=r"^world_size must be an integer >= 1, got 0$"):
        mp.recommend_parallelism(50, 100, 0.01, 0.001, 0)


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_stage_devices_use_gpus_only_with_one_per_stage(monkeypatch, gpus):
    """A one-GPU box (mocked) splits on the CPU and says the pipeline timings are CPU processes."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    devices, note = mp.stage_devices(2)
    if gpus >= 2:
        assert devices == [torch.device("cuda", 0), torch.device("cuda", 1)] and note == "2 GPUs, one stage each"
    else:
        assert devices == [torch.device("cpu")] * 2
        assert note.startswith(f"only {gpus} GPU(s)") and "two CPU processes" in note
