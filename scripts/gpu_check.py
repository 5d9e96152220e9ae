"""`make gpu-check`: on a CUDA box, run the tests and every notebook in full mode plus the GPU benchmarks, and
write docs/gpu-report.md. Without a GPU: say so, render the report from recorded fixtures (a dry run that
checks the report writer) and exit 0.

    .venv/bin/python scripts/gpu_check.py                   # live on a GPU box; dry run elsewhere
    .venv/bin/python scripts/gpu_check.py --dry-run --out docs/gpu-report.md
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))     # its developer modules: gpu_report, step_lanes (not the learner's kit)

from step_lanes import GpuMemorySampler, Step, run_steps  # noqa: E402  (torch-free)
from labkit.core.rundirs import run_path  # noqa: E402
FIXTURES = REPO / "tests" / "fixtures" / "gpu_check"
NOTEBOOK_CELL_TIMEOUT_S = 900
STEP_TIMEOUT_S = 3 * 3600
DRY_RUN_NOTES = ["Notebooks 01 and 05 passed on the H100 as well (no per-cell log was kept for them).",
                 "The test file table lists only the files with failures: the H100 log itemises failures, not passes "
                 "(345 passed, 11 failed, 5 errors in all).",
                 "Memory rows: the recorded H100 peaks (baseline subtracted, second step) against the current memory "
                 "model built on a CPU. The misses are fp32 rows at small batches: cuDNN's convolution workspace, "
                 "chosen per layer and batch on the GPU. The recorded run predates its measurement (workspace: "
                 "'not measured'); a live run measures it layer by layer and adds it to each prediction."]


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def machine_versions() -> dict:
    """Device, torch, CUDA, driver and TensorFlow ('absent: why') of this machine."""
    import torch

    from labkit.core.machine import package_version

    from labkit.core.device import device_label
    from labkit.core.procs import tensorflow_missing_reason

    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        driver = "unknown (nvidia-smi not found)"
    reason = tensorflow_missing_reason()
    tf = (package_version("tensorflow") or package_version("tensorflow-cpu")) if reason is None else f"absent: {reason}"
    return {"device": f"{device_label('cuda')}, {torch.cuda.device_count()} GPU(s)", "torch": torch.__version__,
            "cuda": torch.version.cuda or "unknown", "driver": driver or "unknown", "tensorflow": tf}


# Notebooks whose lessons time work on the GPU: in lanes they run one at a time in the GPU's lane (H200, run in 4
# free lanes: 03b's fusion bound read 29.9x against 11x and 11's checkpoint price 116% against 45% with notebook
# 02's batch finder on the same GPU; 03b passed alone). The gloo notebooks beside them use CPUs only; a GPU-timing
# verdict that still sees another process computing on the GPU says INCONCLUSIVE and names it (core.gpu_neighbours).
GPU_TIMING = {"nbval_01_gpu_utilization", "nbval_02_batch_size", "nbval_03_profiling", "nbval_03b_roofline",
              "nbval_07_synchronous_sgd", "nbval_10_tuning_ladder", "nbval_11_sharding_and_memory",
              "checkpoint_price", "memory_check", "tests"}
# The GPU lane's order: the longest first, so a deadline cuts the cheap steps, not the capstone.
GPU_LANE_ORDER = ("checkpoint_price", "nbval_10_tuning_ladder", "nbval_02_batch_size", "nbval_11_sharding_and_memory",
                  "nbval_07_synchronous_sgd", "nbval_03b_roofline", "nbval_01_gpu_utilization", "nbval_03_profiling",
                  "memory_check", "tests")
# Planning estimates (s) on one H200 in full mode, from the live run of 26 November 2026 (docs/gpu-report.md, run 2
# where a step ran there, else run 1); a step not listed is planned at 60 s. They balance the lanes and give the plan
# written into the report (PLAN_NOTE): nothing is judged against them.
COST_S = {"gpu_tests": 40, "loop_overhead": 45, "checkpoint_price": 25, "nbval_10_tuning_ladder": 280,
          "nbval_02_batch_size": 102, "nbval_11_sharding_and_memory": 60, "nbval_07_synchronous_sgd": 57,
          "nbval_03b_roofline": 26, "nbval_01_gpu_utilization": 26, "nbval_03_profiling": 22, "memory_check": 22,
          "tests": 60, "nbval_04_input_pipelines": 180, "nbval_06b_mpi": 82, "nbval_05_model_vs_data_parallelism": 53,
          "nbval_09_multi_gpu_pitfalls": 46, "nbval_06_all_reduce": 37, "nbval_08_tensorflow_distribution": 20,
          "nbval_12_multi_node": 13, "nbval_00_start_here": 12}
# Test files that reach a GPU: the instruments and the step alone first; the rest in the GPU lane.
GPU_TEST_FILES = ("tests/training/test_gpu_instruments.py", "tests/core/test_step.py", "tests/training/test_run_memory.py",
                  "tests/training/test_sampling.py", "tests/core/test_device.py")
LANE_TEST_FILES = ("tests/cli/test_bench.py", "tests/cli/test_profile.py", "tests/core/test_gpu_neighbours.py",
                   "tests/core/test_verdict.py", "tests/training/test_loop.py", "tests/training/test_window.py")
LENT_SLOT_DEADLINE_S = 560       # a lent GPU's 10-minute slot, less the report and the transfers


def _pytest(py: str, work: Path, name: str, files: tuple[str, ...]) -> tuple[str, ...]:
    return (py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files, f"--junitxml={work / f'{name}.xml'}")


def gpu_check_steps(py: str, work: Path, test_paths: list[str]) -> list[Step]:
    """Every step of the check: the alone steps, then the GPU lane in GPU_LANE_ORDER, then the CPU-only steps."""
    steps = [Step("gpu_tests", _pytest(py, work, "tests_gpu", GPU_TEST_FILES), COST_S["gpu_tests"], alone=True,
                  stdout=str(work / "gpu_tests.log")),
             Step("loop_overhead", (py, "benchmarks/loop_overhead.py", "--json", str(work / "loop_overhead.json")),
                  COST_S["loop_overhead"], alone=True, stdout=str(work / "loop_overhead.stdout.txt")),
             Step("checkpoint_price", (py, "benchmarks/checkpoint_price.py", "--json", str(work / "checkpoint.json")),
                  COST_S["checkpoint_price"], stdout=str(work / "checkpoint_price.stdout.txt"), gpu_timing=True),
             Step("memory_check", (py, "benchmarks/memory_check.py", "--json", str(work / "memory.json")),
                  COST_S["memory_check"], stdout=str(work / "memory.stdout.txt"), gpu_timing=True),
             Step("tests", _pytest(py, work, "tests", tuple(test_paths) or LANE_TEST_FILES), COST_S["tests"],
                  stdout=str(work / "tests.log"), gpu_timing=True)]
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        name = f"nbval_{nb.stem}"
        steps.append(Step(name, (py, "-m", "pytest", "-q", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
                                 f"--nbval-cell-timeout={NOTEBOOK_CELL_TIMEOUT_S}", f"--junitxml={work / f'{name}.xml'}",
                                 str(nb.relative_to(REPO))), COST_S.get(name, 60), stdout=str(work / f"{name}.log"),
                          gpu_timing=name in GPU_TIMING))
    rank = {name: i for i, name in enumerate(GPU_LANE_ORDER)}
    return sorted(steps, key=lambda s: (not s.alone, not s.gpu_timing, rank.get(s.name, len(rank)), -s.cost_s))


def plan_note(steps: list[Step], lanes: int, deadline_s: float | None) -> str:
    """The plan in numbers: the alone steps, then the GPU lane one step after another, against the deadline."""
    alone = sum(s.cost_s for s in steps if s.alone)
    gpu_lane = sum(s.cost_s for s in steps if s.gpu_timing and not s.alone)
    others = sum(s.cost_s for s in steps if not s.gpu_timing and not s.alone)
    other_lanes = max(1, lanes - 1)
    return (f"Plan (estimates from the recorded H200 step times): alone {alone:.0f} s, then the GPU lane "
            f"{gpu_lane:.0f} s one step after another beside {others:.0f} s of CPU-only steps in {other_lanes} "
            f"lane(s) (~{others / other_lanes:.0f} s each): {alone + gpu_lane:.0f} s on the critical path against a "
            f"deadline of {deadline_s:.0f} s." if deadline_s else
            f"Plan: alone {alone:.0f} s, GPU lane {gpu_lane:.0f} s, CPU-only {others:.0f} s (no deadline).")


def default_lanes() -> int:
    """One lane per 4 CPUs (at most 4): the GPU's lane and up to three CPU-only lanes."""
    return max(1, min(4, len(os.sched_getaffinity(0)) // 4))


def carried_wheels_env(site: Path) -> dict[str, str]:
    """A lent GPU box reaches no registry: install the wheels `make gpu-wheels` put in .whl/ for what its Python
    lacks (into ``site``, never over its own packages) and return the PYTHONPATH every step needs."""
    import importlib.metadata as md

    wheels = sorted((REPO / ".whl").glob("*.whl"))
    missing = []
    for wheel in wheels:
        name = wheel.name.split("-")[0]
        try:
            md.version(name)
        except md.PackageNotFoundError:
            missing.append(str(wheel))
    if missing:
        site.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(site), *missing], check=True, timeout=300)
        print(f"installed {len(missing)} carried wheel(s) of {len(wheels)} into {site}")
    parts = [str(REPO), *([str(site)] if missing else []), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def live_run(work: Path, lanes: int = 1, deadline_s: float | None = None, skip: tuple[str, ...] = (),
             test_paths: tuple[str, ...] = ("tests",), alone: tuple[str, ...] = ()) -> int:
    """Every step of the check; writes steps.json; returns how many steps did not end ok (the report is written)."""
    steps = [dataclasses.replace(s, alone=s.alone or s.name in alone)
             for s in gpu_check_steps(sys.executable, work, list(test_paths)) if s.name not in skip]
    env = {**os.environ, **carried_wheels_env(work / "site"), "LABKIT_MODE": "full",
           "LABKIT_LESSON_LOG": str(work / "lessons.jsonl")}
    (work / "plan.txt").write_text(plan_note(steps, lanes, deadline_s))
    started = time.time()
    sampler = GpuMemorySampler()
    sampler.start()
    try:
        records = run_steps(steps, lanes=lanes, deadline_s=deadline_s, env=env, cwd=REPO, sampler=sampler)
    finally:
        sampler.stop()
    ladder_json = work / "ladder" / "ladder.json"
    notebook_ladder = run_path("ladder") / "ladder.json"      # notebook 10's climb saves its ladder here
    if ladder_json.is_file():
        (work / "ladder.json").write_text(ladder_json.read_text())
    elif notebook_ladder.is_file() and notebook_ladder.stat().st_mtime >= started:
        (work / "ladder.json").write_text(notebook_ladder.read_text())
    (work / "steps.json").write_text(json.dumps({"lanes": lanes, "deadline_s": deadline_s,
                                                 "steps": [r.to_dict() for r in records]}, indent=1))
    return sum(r.status != "ok" for r in records)


def write_report(text: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def dry_run(out: Path) -> int:
    """Render the report from the recorded H100 fixtures and check that every section came out."""
    from gpu_report import load_inputs, render_report

    versions = json.loads((FIXTURES / "versions.json").read_text())
    text = render_report(load_inputs(FIXTURES, versions, dry_run=True, notes=DRY_RUN_NOTES))
    missing = [s for s in ("DRY RUN", "## Machine", "## Notebooks", "## Test files", "### Instrumented loop",
                           "### Memory model", "### Tuning ladder") if s not in text]
    unrecorded = "Not available: `benchmarks/checkpoint_price.py --json` produced nothing."   # no recorded fixture
    if missing or "Not available" in text.replace(unrecorded, ""):
        print(f"dry run FAILED: the report writer left out {missing or 'a fixture'}", file=sys.stderr)
        return 1
    print(f"dry run ok: report rendered from {FIXTURES.relative_to(REPO)} -> {write_report(text, out)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="render from recorded fixtures even on a GPU box")
    parser.add_argument("--out", type=Path, help="report path (default: docs/gpu-report.md live, "
                        "runs/gpu-check/gpu-report-dry-run.md for a dry run)")
    parser.add_argument("--lanes", type=int, default=default_lanes(), help="run the steps that need not be alone in "
                        "this many lanes, each pinned to its share of the CPUs (default: one lane per 4 CPUs, at most "
                        "4; 1: one step after another)")
    parser.add_argument("--deadline-s", type=float, default=LENT_SLOT_DEADLINE_S, help="stop what still runs after "
                        "this many seconds and list what never started (default: a lent GPU's 10-minute slot; 0: none)")
    parser.add_argument("--skip", nargs="*", default=[], help="step names to leave out (see steps.json)")
    parser.add_argument("--tests", nargs="*", default=[], help="test paths of the GPU lane's pytest step (default: "
                        "the test files that reach a GPU; `--tests tests` runs the whole suite)")
    parser.add_argument("--alone", nargs="*", default=[], help="step names to run by themselves, before the lanes "
                        "(timing lessons that another step on the GPU would disturb)")
    args = parser.parse_args(argv)
    if args.lanes < 1 or args.deadline_s < 0:
        parser.error("--lanes must be at least 1 and --deadline-s at least 0 (0: no deadline)")
    if args.dry_run or not cuda_present():
        if not args.dry_run:
            print("no CUDA GPU on this machine: nothing to check live; dry run of the report writer instead")
        return dry_run(args.out or run_path("gpu-check", "gpu-report-dry-run.md"))
    from gpu_report import load_inputs, render_report

    work = run_path("gpu-check")
    previous = work.with_name("gpu-check.previous")     # a failed step must show "not available", never an older
    shutil.rmtree(previous, ignore_errors=True)          # result; the older run is kept aside, not deleted (a rerun
    if work.exists():                                    # by mistake must not destroy the evidence of a lent GPU)
        work.rename(previous)
    work.mkdir(parents=True, exist_ok=True)
    versions = machine_versions()
    (work / "versions.json").write_text(json.dumps(versions, indent=1))   # the report can be rendered again
    failures, crash = 1, None
    try:
        failures = live_run(work, args.lanes, args.deadline_s or None, tuple(args.skip), tuple(args.tests),
                            tuple(args.alone))
    except (Exception, KeyboardInterrupt) as err:       # the report is written whatever stopped the run
        crash = f"The check itself stopped early: {type(err).__name__}: {err}"
    notes = [n for n in ((work / "plan.txt").read_text() if (work / "plan.txt").is_file() else "", crash) if n]
    text = render_report(load_inputs(work, versions, notes=notes))
    print(f"wrote {write_report(text, args.out or REPO / 'docs' / 'gpu-report.md')}; {failures} step(s) failed"
          + (f"; {crash}" if crash else ""))
    return 1 if failures or crash else 0


if __name__ == "__main__":
    sys.exit(main())
