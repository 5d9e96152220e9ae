"""Tests for labkit.profile.operators: FLOPs agree with FlopCounterMode, bytes with hand-counted tensor sizes."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from labkit.core.verdict import Load
from labkit.profile.operators import (OpCall, OperatorRecorder, OpStats, aggregate, as_table, bytes_moved, heaviest,
                                      judge_near_roof, kind_of, record_training_steps, rival_roof_ratio, roof_ratio,
                                      share_of_time, step_roof_times)
from labkit.profile.roofline import RoofMeasurement, Roofs

CPU = torch.device("cpu")
ROOFS = Roofs("test", {"fp32": RoofMeasurement("matmul fp32", "FLOP/s", (100e9,), 1)},
              {"triad": RoofMeasurement("triad", "B/s", (10e9,), 1)})


def test_matmul_flops_match_flop_counter_mode_and_bytes_match_the_tensors():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    with OperatorRecorder(CPU) as rec:
        a @ b
    with FlopCounterMode(display=False) as counter:
        a @ b
    (call,) = rec.calls
    assert call.name == "mm" and call.flops_counted and call.flops == counter.get_total_flops() == 2 * 64 * 32 * 16
    assert call.bytes_moved == 4 * (64 * 32 + 32 * 16 + 64 * 16) and call.time_s > 0


def test_elementwise_counts_one_flop_per_output_and_views_move_nothing():
    x = torch.randn(1000)
    with OperatorRecorder(CPU) as rec:
        y = x.view(10, 100).t()          # views: not recorded
        torch.relu(y)
        x.add_(1.0)                      # in place: reads x and writes x
    assert [c.name for c in rec.calls] == ["relu", "add_"]
    relu, add = rec.calls
    assert relu.flops == 1000 and not relu.flops_counted and relu.bytes_moved == 8000
    assert add.bytes_moved == 8000


def test_bytes_count_a_repeated_input_once():
    x = torch.randn(10)
    assert bytes_moved((x, x), {}, x * x) == 80


def test_kinds():
    assert kind_of("convolution", True) == "matmul/conv"
    assert kind_of("native_batch_norm_backward", False) == "normalisation"
    assert kind_of("threshold_backward", False) == "elementwise/other"


def test_aggregate_per_step_predicts_with_the_roofline():
    calls = [OpCall("mm", "a", 2e9, 1e6, 0.04, True), OpCall("mm", "a", 2e9, 1e6, 0.02, True),
             OpCall("relu", "b", 1e6, 1e8, 0.03, False), OpCall("relu", "b", 1e6, 1e8, 0.01, False)]
    rows = aggregate(calls, steps=2, roofs=ROOFS)
    mm = next(r for r in rows if r.name == "mm")
    assert mm.calls_per_step == 1 and mm.flops == 2e9 and mm.time_s == pytest.approx(0.02)   # the fastest call
    assert mm.predicted_s == pytest.approx(0.02) and mm.bound == "compute"
    assert mm.measured_over_predicted == pytest.approx(1.0)
    relu = next(r for r in rows if r.name == "relu")
    assert relu.bound == "memory" and relu.predicted_s == pytest.approx(0.01)
    assert roof_ratio([mm, relu]) == pytest.approx((0.02 + 0.01) / (0.02 + 0.01))
    assert share_of_time(rows, "matmul/conv") == pytest.approx(2 / 3)
    assert step_roof_times(calls, 2, ROOFS) == (pytest.approx((2e9 + 1e6) / 100e9), pytest.approx((1e6 + 1e8) / 10e9),
                                                pytest.approx(0.02 + 0.01))
    assert as_table(rows, top=1)[0]["operator"] == "mm"


def test_heaviest_picks_the_rows_carrying_the_share():
    calls = [OpCall("conv", str(i), f, 1.0, 1.0, True) for i, f in enumerate((70.0, 20.0, 10.0))]
    rows = aggregate(calls, 1, ROOFS)
    assert [r.flops for r in heaviest(rows, ["matmul/conv"], share=0.8)] == [70.0, 20.0]
    assert heaviest(rows, ["normalisation"]) == []


def test_a_real_training_step_accounts_forward_backward_and_optimizer():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    batch = torch.randn(5, 8), torch.randint(0, 4, (5,))
    calls = record_training_steps(model, batch, steps=2, device=CPU)
    names = {c.name for c in calls}
    assert {"addmm", "mm", "relu", "threshold_backward"} <= names                 # forward and backward
    assert any(n.startswith("_foreach") or n in ("add_", "mul_") for n in names)   # the SGD update
    with FlopCounterMode(display=False) as counter:                                 # reference: fwd + bwd FLOPs
        nn.CrossEntropyLoss()(model(batch[0]), batch[1]).backward()
    counted = sum(c.flops for c in calls if c.flops_counted) / 2
    assert counted == counter.get_total_flops()



def test_operators_that_fit_the_cache_meet_the_cache_roof():
    roofs = Roofs("test", ROOFS.compute, {"triad": RoofMeasurement("triad", "B/s", (10e9,), 2**30),
                                          "triad in cache": RoofMeasurement("triad in cache", "B/s", (50e9,), 2**20)})
    assert roofs.cache_limit_bytes == 3 * 2**20
    small = [OpCall("relu", "s", 0.0, 2**20, 1.0, False)]
    big = [OpCall("relu", "b", 0.0, 2**22, 1.0, False)]
    assert step_roof_times(small, 1, roofs)[1] == pytest.approx(2**20 / 50e9)
    assert step_roof_times(big, 1, roofs)[1] == pytest.approx(2**22 / 10e9)


def _row(flops, nbytes, time_s, roofs=ROOFS):
    return OpStats("op", "1", "matmul/conv", 1.0, flops, nbytes, time_s, roofs.predict_time_s(flops, nbytes),
                   roofs.bound(flops, nbytes))


def test_the_rival_prices_every_operator_at_one_roof():
    rows = [_row(100e9, 1e9, 1.0)]          # 1 s at the compute roof, 0.1 s at the bandwidth roof
    assert rival_roof_ratio(rows, ROOFS, "bandwidth") == pytest.approx(0.1)
    assert rival_roof_ratio(rows, ROOFS, "compute") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="priced_at"):
        rival_roof_ratio(rows, ROOFS, "cache")


def test_near_the_roof_is_checked_and_rejects_the_other_roof():
    on_roof = judge_near_roof("near", [_row(100e9, 1e9, 1.1)], ROOFS, (0.5, 10.0), Load(), "bandwidth")
    assert on_roof.state == "checked" and on_roof.rival == "every operator priced at the bandwidth roof"
    assert "rules out" in on_roof.detail


def test_when_the_rival_is_true_the_band_fails_it():
    # compute-bound operators timed at the bandwidth roof's price (0.1 of the roofline's time): the rival is true
    at_rival = judge_near_roof("near", [_row(100e9, 1e9, 0.1)], ROOFS, (0.05, 10.0), Load(), "bandwidth")
    assert at_rival.state == "failed"       # the low edge rose from 0.05 to the rival's 0.1 x (1 + spread)
    # a band whose top sits below the rival cannot tell them apart at all
    assert judge_near_roof("near", [_row(100e9, 1e9, 0.1)], ROOFS, (0.01, 0.05), Load(), "bandwidth").state == "failed"
    # the rival sits below the band's top, but the roofs' spread lifts the low edge past it: this run cannot judge
    disturbed = Roofs("test", ROOFS.compute, {"triad": RoofMeasurement("triad", "B/s", (10e9, 0.05e9, 0.05e9), 1)})
    unsure = judge_near_roof("near", [_row(100e9, 1e9, 1.1)], disturbed, (0.5, 10.0), Load(), "bandwidth")
    assert unsure.state == "INCONCLUSIVE" and unsure.kind == "spread" and "200x their median" in unsure.detail, unsure
    # a rival inside the lesson's band fails by design, however the spread moved the low edge
    inside = judge_near_roof("near", [_row(100e9, 1e9, 1.1)], disturbed, (0.05, 10.0), Load(), "bandwidth")
    assert inside.state == "failed" and "cannot tell" in inside.detail, inside
    # the memory band's rival: elementwise bytes priced at the compute roof instead
    stream = [_row(1e6, 1e9, 1e-5)]         # 0.1 s of bytes, 1e-5 s of FLOPs: timed at the compute price
    assert judge_near_roof("near", stream, ROOFS, (1e-6, 10.0), Load(), "compute").state == "failed"
