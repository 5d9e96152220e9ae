"""DDP, hand-written ZeRO-1 and FSDP2 on two real gloo ranks: same weights as one process, counted bytes
equal the prediction, counted traffic equals the closed form; and the decision table's rule."""
import pytest

from labkit.sharding import strategies as sharding
from labkit.sharding.advice import Scenario, advise, option_costs

GB = 10**9


@pytest.fixture(scope="module")
def two_rank_rows():
    cfg = sharding.ShardingConfig(steps=2)
    return cfg, sharding.summarize_runs(cfg, {2: sharding.run_strategies(cfg, 2, timeout_s=150)})


def test_every_strategy_matches_single_process(two_rank_rows):
    _, rows = two_rank_rows
    assert {r["strategy"] for r in rows} == {"ddp", "zero1", "zero2", "zero3"}
    assert all(r["max_weight_diff"] <= 1e-6 for r in rows), [(r["strategy"], r["max_weight_diff"]) for r in rows]


def test_counted_bytes_match_prediction(two_rank_rows):
    cfg, rows = two_rank_rows
    slack = sharding.adam_step_tensor_slack_bytes(cfg)
    for r in rows:
        assert abs(r["counted_total_bytes"] - r["predicted_total_bytes"]) <= slack, r
    by = {r["strategy"]: r for r in rows}
    assert by["zero3"]["counted_params_bytes"] * 2 == by["ddp"]["counted_params_bytes"]
    assert by["zero1"]["counted_grads_bytes"] == by["ddp"]["counted_grads_bytes"]


def test_counted_traffic_matches_closed_form_and_simulator(two_rank_rows):
    _, rows = two_rank_rows
    for r in rows:
        assert r["counted_comm_bytes"] == r["predicted_comm_bytes"] == r["simulated_comm_bytes"] > 0, r


def test_config_validated():
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        sharding.ShardingConfig(steps=0)
    with pytest.raises(ValueError, match="lr must be a number > 0, got 0.0"):
        sharding.ShardingConfig(lr=0.0)


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
