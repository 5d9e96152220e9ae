"""The decision table: DDP when it fits, sharding when it does not, recompute over ZeRO-3 traffic on a slow link."""
import pytest

from labkit.sharding.advice import Scenario, advise, option_costs

GB = 10**9


def _scenario(**kw):
    base = dict(name="x", num_params=10**6, gpu_memory_bytes=80 * GB, world_size=8, link_bytes_per_s=100 * GB,
                activation_bytes_per_rank=GB, checkpointed_activation_fraction=0.2, forward_s=0.1)
    return Scenario(**{**base, **kw})


def test_advice_prefers_ddp_when_it_fits():
    assert advise(_scenario())["choice"] == "DDP"


def test_advice_shards_when_ddp_does_not_fit():
    row = advise(_scenario(num_params=7_500_000_000, activation_bytes_per_rank=40 * GB))
    assert row["choice"] not in ("DDP",) and row["DDP GB/rank"] > 80


def test_advice_says_when_nothing_fits():
    assert advise(_scenario(num_params=10**12, world_size=2))["choice"].startswith("does not fit")


def test_slow_link_prefers_recompute_to_zero3_traffic():
    big = dict(num_params=7_500_000_000, activation_bytes_per_rank=60 * GB, forward_s=0.5)
    fast, slow = _scenario(**big), _scenario(**big, link_bytes_per_s=1 * GB)
    costs = {r["option"]: r for r in option_costs(slow)}
    assert costs["FSDP (ZeRO-3)"]["comm_s"] == pytest.approx(1.5 * costs["DDP"]["comm_s"])
    assert not costs["ZeRO-2"]["fits"] and costs["ZeRO-2 + checkpointing"]["fits"] and costs["FSDP (ZeRO-3)"]["fits"]
    assert advise(fast)["choice"] == "FSDP (ZeRO-3)"
    assert advise(slow)["choice"] == "ZeRO-2 + checkpointing"


def test_scenario_validated():
    with pytest.raises(ValueError, match="checkpointed_activation_fraction"):
        _scenario(checkpointed_activation_fraction=0.0)
