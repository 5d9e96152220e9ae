"""torch's pipeline schedules on real gloo ranks (labkit.parallel.pipeline.schedules): exact against one process,
the scale_grads pitfall, the orders, the messages, the memory bound, and a hang that names its rank and action."""
import os
import tempfile
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from labkit.comm.launch import RUN_DIR_PREFIX
from labkit.parallel.pipeline import schedules as ps
from tests.parallel.pipeline.stall_support import rank_zero_freezes_after_warm_up, rank_zero_stops_after_warm_up
from labkit.parallel.pipeline import schedule_report as report
from labkit.parallel.pipeline import schedule_sim as sim

SMALL = ps.PipeConfig(width=32, blocks=4, micro_batch=4)


def test_placements_loop_and_v():
    assert ps.stage_ranks(2, 1, "loop") == [0, 1]
    assert ps.stage_ranks(2, 2, "loop") == [0, 1, 0, 1]
    assert ps.stage_ranks(3, 2, "v") == [0, 1, 2, 2, 1, 0]
    with pytest.raises(ValueError, match="style must be"):
        ps.stage_ranks(2, 3, "v")


def test_every_cut_is_the_same_model_and_the_reference_is_its_gradient():
    whole = nn.Sequential(*ps.build_stage_modules(SMALL, 1))
    split = nn.Sequential(*ps.build_stage_modules(SMALL, 4))
    x, y = ps.make_batch(SMALL, 2)
    assert torch.equal(whole(x), split(x))
    losses, grads = ps.reference(SMALL, 2)
    loss = (ps.mse_loss(whole(x[:4]), y[:4]) + ps.mse_loss(whole(x[4:]), y[4:])) / 2
    with torch.no_grad():
        want = [float(ps.mse_loss(whole(x[:4]), y[:4])), float(ps.mse_loss(whole(x[4:]), y[4:]))]
    assert losses == pytest.approx(want)
    for got, want in zip(grads, torch.autograd.grad(loss, list(whole.parameters()))):
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="do not split into 3 equal stages"):
        ps.build_stage_modules(SMALL, 3)


def test_bad_input_is_one_clear_error_before_anything_launches():
    with pytest.raises(ValueError, match="is not in this torch"):
        ps.run_schedules([{"schedule": "ScheduleMagic", "micro_batches": 2}], SMALL)
    with pytest.raises(ValueError, match="equal stages"):
        ps.run_schedules([{"schedule": "ScheduleZBVZeroBubble", "micro_batches": 4}], ps.PipeConfig(blocks=2))


@pytest.fixture(scope="module")
def live():
    names = [n for n in ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble")
             if n in ps.available_schedules()]
    runs = [{"schedule": n, "micro_batches": 4} for n in names]
    runs += [{"schedule": "Schedule1F1B", "micro_batches": 2},
             {"schedule": "ScheduleGPipe", "micro_batches": 4, "loss_over_m": True}]
    results, layouts = ps.run_schedules(runs, SMALL, ranks=2, repeats=1, timeout_s=120)
    return {n: r for n, r in zip(names, results)}, results[-2], results[-1], layouts


def test_real_schedules_equal_one_process_and_send_what_their_placement_needs(live):
    main, _, _, _ = live
    for name, run in main.items():
        assert run.loss_error < 1e-5 and run.grad_error < 1e-5, name
        assert run.messages == report.expected_messages(run), name
        assert report.early_sends(run) == [] and len([p for p in run.posts if p.what.startswith("send")]) == \
            run.messages, name
        assert len(run.spans) >= 2 * 4 * 2 * run.stages_per_rank            # F and B (or I and W) per mb per stage
        assert run.makespans_s == (sim.makespan_s(run.spans),)              # one timed repeat: the one kept
        assert len(run.rounds) == 1 and run.rounds[0] == (run.spans, run.posts)   # every repeat kept, for replays
    assert main["Schedule1F1B"].messages == 2 * 4 * 1
    if "ScheduleZBVZeroBubble" in main:
        assert main["ScheduleZBVZeroBubble"].rank_stages == {0: [0, 3], 1: [1, 2]}
        assert {s.kind for s in main["ScheduleZBVZeroBubble"].spans} == {"F", "I", "W"}


def test_real_orders_and_memory_follow_the_kits_references(live):
    main, short_1f1b, _, _ = live
    for rank in (0, 1):
        assert report.action_order(main["Schedule1F1B"], rank) == sim.one_f_one_b_order(2, rank, 4)
        assert report.action_order(main["ScheduleGPipe"], rank) == sim.gpipe_order(4)
    per_mb = report.bytes_per_micro_batch(main["ScheduleGPipe"])
    assert main["Schedule1F1B"].peak_bytes == short_1f1b.peak_bytes == {0: 2 * per_mb[0], 1: per_mb[1]}


def test_the_scale_grads_pitfall_and_the_layout_probe(live):
    _, _, pitfall, layouts = live
    assert pitfall.grad_ratio == pytest.approx(1 / 4, rel=1e-4)
    assert layouts["ScheduleGPipe"][1] == "ok" and layouts["ScheduleGPipe"][2] != "ok"
    assert layouts["ScheduleInterleaved1F1B"] == {1: "ok", 2: "ok"}
    if "ScheduleZBVZeroBubble" in layouts:
        assert "exactly 2 stages" in layouts["ScheduleZBVZeroBubble"][1]


def test_a_rank_that_stops_sending_is_named_with_the_action_it_waited_on():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ps.PipelineHang) as err:
        ps.run_schedules([{"schedule": "Schedule1F1B", "micro_batches": 2}], SMALL, repeats=1, timeout_s=60,
                         pg_timeout_s=3, probe=False, worker=rank_zero_stops_after_warm_up)
    line = str(err.value)
    assert "\n" not in line and "rank 1 of 2" in line and "waiting on the activation for stage 1" in line
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert not list(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*"))   # its run folder too


def test_a_frozen_rank_is_named_not_the_rank_that_timed_out_waiting_for_it():
    """Issue 53: rank 0 frozen (SIGSTOP) after the warm-up; rank 1 times out waiting for its activation. The one
    line names rank 0 as frozen (the rival: rank 1, whose timeout was only the symptom, named as the stuck one)."""
    with pytest.raises(ps.PipelineHang) as err:
        ps.run_schedules([{"schedule": "Schedule1F1B", "micro_batches": 2}], SMALL, repeats=1, timeout_s=60,
                         pg_timeout_s=3, probe=False, worker=rank_zero_freezes_after_warm_up)
    line = str(err.value)
    assert "\n" not in line and line.startswith("rank 0 (for ") and "frozen" in line, line
    assert "rank 1 failed waiting for it" in line and "waiting on the activation" in line, line


@pytest.mark.parametrize("kwargs, runs, message", [
    ({"ranks": 0}, [{"schedule": "Schedule1F1B", "micro_batches": 2}], "ranks must be"),
    ({}, [{"schedule": "Schedule1F1B", "micro_batches": 0}], "micro_batches must be"),
    ({}, [{"schedule": "ScheduleGPipe", "micro_batches": 2.0}], "micro_batches must be"),
    ({"ranks": 4}, [{"schedule": "Schedule1F1B", "micro_batches": 2}], "needs micro_batches >= its 4 stages"),
])
def test_bad_arguments_are_one_line_before_any_rank_starts(kwargs, runs, message):
    """Issue 53: ranks=0 was a ZeroDivisionError and micro_batches=0 a PipelineHang from inside the ranks."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=message) as err:
        ps.run_schedules(runs, SMALL, repeats=1, timeout_s=30, probe=False, **kwargs)
    assert "\n" not in str(err.value)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
