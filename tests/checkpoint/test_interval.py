import math

import pytest

from labkit.checkpoint.interval import (cluster_mtbf_s, daly_interval_s, interval_table, wasted_fraction,
                                        young_interval_s)


def test_young_interval_minimises_the_first_order_waste():
    cost, mtbf = 30.0, 24 * 3600.0
    best = young_interval_s(cost, mtbf)
    assert best == pytest.approx(math.sqrt(2 * cost * mtbf))
    for other in (best * 0.9, best * 1.1, best / 4, best * 4):     # rival: any other interval loses more
        assert wasted_fraction(other, cost, mtbf) > wasted_fraction(best, cost, mtbf)


def test_daly_subtracts_the_save_cost_and_caps_at_the_mtbf():
    assert daly_interval_s(30.0, 86400.0) == pytest.approx(young_interval_s(30.0, 86400.0) - 30.0)
    assert daly_interval_s(500.0, 100.0) == 100.0


def test_a_cluster_fails_n_times_as_often_and_the_table_has_young_at_one():
    assert cluster_mtbf_s(512 * 3600.0, 512) == 3600.0
    rows = interval_table(10.0, 3600.0)
    best = min(rows, key=lambda r: r["wasted_fraction"])
    assert best["times_young"] == 1.0
    with pytest.raises(ValueError):
        young_interval_s(0.0, 10.0)
