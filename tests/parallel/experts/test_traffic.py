"""What EP sends: the formula against hand-worked numbers, the counted bytes from split sizes, the band's source."""
import pytest

from labkit.parallel.experts import traffic


def test_formula_is_four_all_to_alls_of_the_leaving_share():
    # 100 copies x 32 hidden x 4 B x (2-1)/2 = 6400 B per all-to-all, four of them
    assert traffic.ep_bytes_per_layer(100, 32, 2) == 4 * 6400
    assert traffic.every_copy_crosses_bytes(100, 32) == 4 * 12800
    assert traffic.ep_bytes_per_layer(100, 32, 1) == 0


def test_counted_bytes_leave_out_the_rank_s_own_block_and_repeat_in_backward():
    counted = traffic.counted_bytes(0, send=[5, 7], recv=[5, 3], hidden=2, bytes_per_element=4)
    assert counted == {"forward": (7 + 3) * 8, "backward": (3 + 7) * 8}


def test_the_band_is_three_binomial_sds_and_narrower_than_the_rival():
    tol = traffic.share_tolerance(400, 2)            # f = 0.5: 3 x sqrt(0.25 / 400) / 0.5 = 0.15
    assert tol == pytest.approx(0.15)
    assert 1 + tol < 1 / traffic.leaving_share(2)    # the rival (share 1) is 2x: outside the band


def test_rows_carry_formula_counted_and_wire():
    run = {"rank": 0, "kept": [10, 10], "send": [8, 12], "recv": [8, 9], "backend": "gloo",
           "wire_bytes": {"forward": 100, "backward": 90}}
    row = traffic.traffic_rows({2: [run]}, hidden=1)[0]
    assert row["counted_bytes"] == 2 * (12 + 9) * 4 and row["wire_bytes"] == 190 and row["left_share"] == 0.6
