"""TP against DP and ZeRO-3 on 2 real gloo ranks: the bytes each rank holds, and the rows and load built from them."""
import pytest

from labkit.core.verdict import Load
from labkit.parallel.tensor import compare as tp_compare, cost as tp_cost
from labkit.parallel.tensor.megatron import LayerShape

SHAPE = LayerShape(seq_len=32, batch=2)


@pytest.fixture(scope="module")
def ranks():
    return tp_compare.run_comparison(SHAPE, 2, rounds=2, timeout_s=120)


def test_tp_and_zero3_halve_model_state_and_tp_sp_keeps_dp_s_activations(ranks):
    rows = {r["strategy"]: r for r in tp_compare.comparison_rows(ranks)}
    whole = 4 * 6 * SHAPE.d_model
    assert rows["zero3"]["params"] * 2 == rows["dp"]["params"]
    assert rows["tp"]["params"] == (rows["dp"]["params"] - whole) // 2 + whole
    assert rows["tp"]["optimizer"] < rows["dp"]["optimizer"] / 1.9
    assert rows["tp_sp"]["activations"] == rows["dp"]["activations"]
    norm = tp_cost.norm_region_bytes(SHAPE.seq_len, SHAPE.batch, SHAPE.d_model)
    assert rows["tp"]["activations"] - rows["dp"]["activations"] == norm // 2
    assert all(r["step_ms"] > 0 for r in rows.values())


def test_the_load_has_every_rank_s_share_and_the_rounds_spread(ranks):
    load = tp_compare.comparison_load(ranks)
    assert isinstance(load, Load) and set(load.shares) == {"rank 0", "rank 1"}
    assert all(len(r["times_s"][s]) == 2 for r in ranks for s in tp_compare.STRATEGIES)


def test_a_layer_that_does_not_split_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match=r"heads=4 must be divisible by tp=3 .*fix: tp in \[1, 2, 4\]"):
        tp_compare.run_comparison(SHAPE, 3)


def test_step_ratios_pair_each_round_by_its_slowest_rank():
    fake = [{"times_s": {"tp": [0.030, 0.050], "dp": [0.020, 0.040]}},
            {"times_s": {"tp": [0.033, 0.045], "dp": [0.030, 0.025]}}]
    assert tp_compare.step_ratios(fake) == pytest.approx([0.033 / 0.030, 0.050 / 0.040])
    assert tp_compare.step_ratios(fake, "dp", "tp") == pytest.approx([0.030 / 0.033, 0.040 / 0.050])
