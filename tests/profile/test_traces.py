"""Tests for labkit.profile.traces: a hand-made trace totalled by category, and unreadable files refused."""
from __future__ import annotations

import json

import pytest

from labkit.profile.traces import load_trace, peak_memory_bytes, summarize_trace


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
