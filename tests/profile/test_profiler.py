"""Tests for labkit.profile.profiler: profiled steps, their labelled categories, operators, memory, bad input."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from labkit.profile.profiler import profile_training
from labkit.profile.traces import CATEGORIES, load_trace, step_numbers, summarize_trace


def tiny_loader(n_batches: int = 4, batch: int = 4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(n_batches)]


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


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


def test_an_interrupt_mid_cycle_writes_no_trace_of_the_cut_cycle(tmp_path):
    """A real Ctrl-C in cycle 1's last step: the profiler's exit must not export that cycle as if it finished."""
    import os
    import signal

    class CtrlCInStep7(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.calls = nn.Linear(6, 3), 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 8:                     # steps 0-3: cycle 0; 4 wait, 5 warm-up, 6-7 cycle 1
                os.kill(os.getpid(), signal.SIGINT)
            return self.lin(x)

    seen = []
    with pytest.raises(KeyboardInterrupt):
        profile_training(CtrlCInStep7(), tiny_loader(), run_dir=tmp_path, wait=1, warmup=1, active=2, repeat=3,
                         on_trace=seen.append)
    assert seen == [tmp_path / "trace_cycle0.pt.trace.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace_cycle0.pt.trace.json"]
    assert step_numbers(load_trace(seen[0])) == [2, 3]


def test_hta_advice_names_the_maintained_package_and_its_import(tmp_path):
    from labkit.profile.profiler import HTA_IMPORT, HTA_PACKAGE, _gpu_extras
    assert (HTA_PACKAGE, HTA_IMPORT) == ("traceinsight", "hta")
    text = _gpu_extras(torch.device("cpu"), tmp_path, snapshot=False, hta=True)["hta"]
    assert "pip install traceinsight" in text and "import hta" in text and "HolisticTraceAnalysis" not in text
