"""The gpu-check step runner: alone steps first, pinned lanes, a deadline that stops and lists, GPU peaks per step."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))   # developer tooling lives in scripts/
from gpu_report import _steps_section
from step_lanes import GpuMemorySampler, Step, plan_lanes, run_steps, split_cpus

PY = sys.executable


def test_split_cpus_into_disjoint_nearly_equal_lanes():
    assert split_cpus(list(range(16)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert split_cpus([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert split_cpus([0, 1], 4) == [[0], [1]]                  # never an empty lane
    with pytest.raises(ValueError, match="at least 1"):
        split_cpus([0, 1], 0)


def test_plan_puts_each_step_on_the_least_loaded_lane_in_priority_order():
    steps = [Step("big", ("x",), 300), Step("a", ("x",), 100), Step("b", ("x",), 100), Step("c", ("x",), 100),
             Step("d", ("x",), 50)]
    plan = plan_lanes(steps, 3)                          # lane 1 is the GPU's: none of these times GPU work
    assert [[s.name for s in lane] for lane in plan] == [[], ["big", "d"], ["a", "b", "c"]]
    assert [s.name for s in plan_lanes(steps, 1)[0]] == ["big", "a", "b", "c", "d"]


def test_gpu_timing_steps_share_the_first_lane_one_after_another_in_order():
    steps = [Step("nb02", ("x",), 200, gpu_timing=True), Step("gloo", ("x",), 50), Step("nb03b", ("x",), 30,
             gpu_timing=True), Step("gloo2", ("x",), 50)]
    plan = plan_lanes(steps, 3)
    assert [s.name for s in plan[0]] == ["nb02", "nb03b"]
    assert sorted(s.name for lane in plan[1:] for s in lane) == ["gloo", "gloo2"]


def _writes_affinity(name, tmp_path, sleep=0.0, alone=False, code=0, gpu=False):
    script = (f"import os, time, json; time.sleep({sleep}); "
              f"open({str(tmp_path / name)!r}, 'w').write(json.dumps([sorted(os.sched_getaffinity(0)), time.time()])); "
              f"raise SystemExit({code})")
    return Step(name, (PY, "-c", script), cost_s=1, alone=alone, gpu_timing=gpu)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin two lanes")
def test_alone_steps_run_first_on_all_cpus_and_lanes_are_pinned_apart(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    steps = [_writes_affinity("lane_a", tmp_path, 0.3, gpu=True), _writes_affinity("lane_b", tmp_path, 0.3),
             _writes_affinity("quiet", tmp_path, alone=True), _writes_affinity("bad", tmp_path, code=3)]
    records = {r.name: r for r in run_steps(steps, lanes=2, cpus=cpus, cwd=tmp_path)}
    seen = {n: json.loads((tmp_path / n).read_text()) for n in ("lane_a", "lane_b", "quiet")}
    assert seen["quiet"][0] == cpus and records["quiet"].lane == "alone"
    assert seen["quiet"][1] < min(seen["lane_a"][1], seen["lane_b"][1])
    assert {tuple(seen["lane_a"][0]), tuple(seen["lane_b"][0])} == {(cpus[0],), (cpus[1],)}
    assert records["lane_a"].status == "ok" and records["bad"].status == "failed (exit 3)"
    assert records["bad"].returncode == 3


def test_the_deadline_stops_a_running_step_and_lists_those_never_started(tmp_path):
    steps = [Step("slow", (PY, "-c", "import time; time.sleep(60)"), 10),
             Step("after", (PY, "-c", "pass"), 10)]
    records = run_steps(steps, lanes=1, deadline_s=1.5, cwd=tmp_path)
    assert [r.status for r in records] == ["stopped at the deadline", "not run (deadline)"]
    assert records[0].wall_s < 15 and records[1].started_s is None
    text = "\n".join(_steps_section({"lanes": 1, "deadline_s": 1.5, "steps": [r.to_dict() for r in records]}))
    assert "stopped at the deadline" in text and "not run (deadline)" in text


def test_gpu_peak_is_summed_over_the_steps_process_tree():
    parent = subprocess.Popen([PY, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import time; time.sleep(30)'])"])
    try:
        import psutil

        for _ in range(100):
            kids = psutil.Process(parent.pid).children(recursive=True)
            if kids:
                break
            psutil.wait_procs([], timeout=0.05)
        child = kids[0].pid
        usage = {child: 300.0, parent.pid: 500.0, 999_999_999: 7000.0}      # the last: another user's process
        sampler = GpuMemorySampler(read=lambda: usage)
        sampler.watch("nb", parent.pid)
        sampler.sample()
        assert sampler.peaks["nb"] == 800.0
        usage[child] = 100.0
        sampler.sample()
        assert sampler.peaks["nb"] == 800.0                                  # a peak, not the last sample
    finally:
        parent.kill()
        parent.wait()
        for p in psutil.Process().children(recursive=True):
            p.kill()


def test_unreadable_nvidia_smi_gives_no_peak_rather_than_zero():
    sampler = GpuMemorySampler(read=lambda: None)
    sampler.watch("nb", os.getpid())
    sampler.sample()
    assert sampler.readable is False
