"""Tests for labkit.profile.profiler and labkit.profile.traces: schedule arithmetic, summaries, bad input."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.profiler import ProfilerAction

from labkit.profile.profiler import ProfileSchedule, changed_ops, compare_runs, profile_training
from labkit.profile.traces import CATEGORIES, load_trace, peak_memory_bytes, step_numbers, summarize_trace


def tiny_loader(n_batches: int = 4, batch: int = 4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(n_batches)]


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


# ------------------------------------------------------------------------------ schedule arithmetic
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(0, 3), st.integers(1, 4), st.integers(1, 3), st.integers(0, 3))
def test_schedule_matches_torch(wait, warmup, active, repeat, skip_first):
    sched = ProfileSchedule(wait, warmup, active, repeat, skip_first)
    fn = sched.to_torch()
    recorded = [i for i in range(sched.steps_needed + 5)
                if fn(i) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)]
    saves = [i for i in range(sched.steps_needed + 5) if fn(i) == ProfilerAction.RECORD_AND_SAVE]
    assert recorded == sched.active_step_numbers()
    assert len(recorded) == sched.profiled_steps == active * repeat
    assert len(saves) == repeat and saves[-1] == sched.steps_needed - 1


def test_schedule_numbers():
    sched = ProfileSchedule(wait=1, warmup=2, active=3, repeat=2)
    assert sched.steps_needed == 12 and sched.profiled_steps == 6
    assert sched.active_step_numbers() == [3, 4, 5, 9, 10, 11]


@pytest.mark.parametrize("kwargs, match", [
    ({"wait": -1}, "wait must be an integer >= 0"),
    ({"active": 0}, "active must be an integer >= 1"),
    ({"repeat": 0}, "repeat must be an integer >= 1"),
    ({"warmup": 1.5}, "warmup must be an integer"),
    ({"wait": True}, "wait must be an integer"),
])
def test_schedule_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProfileSchedule(**kwargs)


# ------------------------------------------------------------------------------ profile_training
def test_profile_tiny_model(tmp_path):
    s = profile_training(tiny_model(), tiny_loader(), run_dir=tmp_path / "tiny", wait=1, warmup=1, active=2,
                         repeat=2, sync_every_step=True)
    assert s.profiled_steps == s.expected_steps == 4
    assert s.step_numbers == [2, 3, 6, 7] == s.schedule.active_step_numbers()
    assert len(s.trace_files) == 2 and s.samples_per_step == 4
    for path in s.trace_files:   # the JSON parses and holds the profiled steps
        trace = json.loads(path.read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert any(n.startswith("ProfilerStep#") for n in names if n)
    assert step_numbers(load_trace(s.trace_files[0])) == [2, 3]
    for cat in ("forward", "backward", "optimizer", "data_loading"):
        assert s.category_s[cat] > 0, cat
    assert s.category_s["communication"] == 0.0
    assert sum(s.category_s.values()) == pytest.approx(
        sum(summarize_trace(p).step_time_s[i] for p in s.trace_files for i in range(2)) / 4, rel=1e-6)
    assert s.item_calls_per_step == 1.0
    ops = {r["name"]: r for r in s.top_ops}
    assert ops["aten::addmm"]["calls"] == 2.0          # two Linear layers, one addmm each per step
    assert ops["aten::relu"]["calls"] == 1.0
    assert s.peak_mem_bytes is not None and s.peak_mem_bytes > 0
    assert "Input Shapes" in s.op_table
    assert set(s.per_sample_s()) == set(CATEGORIES) | {"total"}
    assert sum(s.shares().values()) == pytest.approx(1.0)
    assert "profiled steps" in str(s)


def test_no_sync_means_no_item_calls(tmp_path):
    s = profile_training(tiny_model(), tiny_loader(), run_dir=tmp_path, active=2, sync_every_step=False)
    assert s.item_calls_per_step == 0.0 and s.category_s["sync"] == 0.0


def test_loader_is_restarted_when_short(tmp_path):
    s = profile_training(tiny_model(), tiny_loader(n_batches=2), run_dir=tmp_path, wait=2, warmup=1, active=3)
    assert s.profiled_steps == 3


def test_rerun_replaces_old_traces(tmp_path):
    profile_training(tiny_model(), tiny_loader(), run_dir=tmp_path, active=1, repeat=3)
    s = profile_training(tiny_model(), tiny_loader(), run_dir=tmp_path, active=1, repeat=1)
    assert len(list(tmp_path.glob("trace_cycle*.json"))) == 1 == len(s.trace_files)


def test_too_few_steps(tmp_path):
    with pytest.raises(ValueError, match="fewer than the schedule needs.*= 5"):
        profile_training(tiny_model(), tiny_loader(), run_dir=tmp_path, steps=3)


def test_unwritable_dir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="run_dir=.*not a writable directory"):
        profile_training(tiny_model(), tiny_loader(), run_dir=blocker / "sub")


def test_empty_loader(tmp_path):
    with pytest.raises(ValueError, match="no batches"):
        profile_training(tiny_model(), [], run_dir=tmp_path)


def test_profiler_stopped_when_training_raises(tmp_path):
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("boom in step 3")
            return self.lin(x)

    with pytest.raises(RuntimeError, match="boom"):
        profile_training(Boom(), tiny_loader(), run_dir=tmp_path)
    assert not torch.autograd.profiler._is_profiler_enabled
    s = profile_training(tiny_model(), tiny_loader(), run_dir=tmp_path, active=1)   # a new profile still works
    assert s.profiled_steps == 1


# ------------------------------------------------------------------------------ trace_summary on a known trace
def _span(name, ts, dur, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def test_summary_of_hand_made_trace(tmp_path):
    events = [_span("ProfilerStep#4", 0, 1000), _span("labkit/data_loading", 0, 100),
              _span("labkit/forward", 100, 300), _span("aten::addmm", 150, 50, "cpu_op"),
              _span("labkit/backward", 400, 400), _span("labkit/optimizer", 800, 100),
              _span("c10d::allreduce_", 920, 30, "cpu_op"), _span("aten::item", 960, 10, "cpu_op"),
              _span("ProfilerStep#5", 1000, 500), _span("labkit/forward", 1000, 500),
              {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5,
               "args": {"Total Allocated": 4096, "Device Type": 0}},
              {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 6,
               "args": {"Total Allocated": 1024, "Device Type": 0}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    stats = summarize_trace(path)
    assert stats.steps == [4, 5] and stats.step_time_s == pytest.approx([1e-3, 5e-4])
    c = stats.category_s
    assert c["data_loading"] == pytest.approx(1e-4) and c["forward"] == pytest.approx(8e-4)
    assert c["backward"] == pytest.approx(4e-4) and c["optimizer"] == pytest.approx(1e-4)
    assert c["communication"] == pytest.approx(3e-5)
    assert c["idle"] == pytest.approx(1.5e-3 - 1.43e-3)
    assert stats.item_calls == 1 and stats.peak_mem_bytes == 4096
    assert peak_memory_bytes(json.loads(path.read_text()), device_type=1) is None


def test_load_trace_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the profiler"):
        load_trace(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_trace(bad)


def test_compare_and_changed_ops(tmp_path):
    runs = {f"bs{b}": profile_training(tiny_model(), tiny_loader(batch=b), run_dir=tmp_path / str(b), active=2)
            for b in (1, 8)}
    table = compare_runs(runs)
    assert list(table.columns) == ["bs1", "bs8"] and "total" in table.index
    rows = changed_ops(runs["bs1"], runs["bs8"], top=3)
    assert len(rows) == 3 and all(r["change"] == pytest.approx(r["share_b"] - r["share_a"]) for r in rows)
    with pytest.raises(ValueError, match="two or more"):
        compare_runs({"only": runs["bs1"]})
