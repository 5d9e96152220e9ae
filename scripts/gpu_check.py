"""`make gpu-check`: one slot of a lent GPU. Choose the steps of the evidence ledger (docs/gpu-report.md) whose
row is missing, stale or oldest, as many as fit the deadline; run them one after another in full mode; merge each
row into the ledger as it ends, and write the ledger whatever stops the slot (a signal, Ctrl-C, a crash). It never
runs twice in one slot: a second start within the hour is refused (exit 2) and touches nothing. Without a GPU:
say so, dry-run the report writer on recorded fixtures, print the next slot's plan and exit 0.

    .venv/bin/python scripts/gpu_check.py                   # live on a GPU box; dry run elsewhere
    .venv/bin/python scripts/gpu_check.py --plan            # the next slot's steps, budgets and total, anywhere
    .venv/bin/python scripts/gpu_check.py --commit "$(git rev-parse HEAD)"   # on a box whose tree has no .git
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))     # its developer modules: gpu_report, step_lanes (not the learner's kit)

from gpu_ledger import (FULL_MODE_BUDGET_S, NOT_FINISHED, Choice, LedgerRow, all_steps, budget_lines,  # noqa: E402
                        choose_steps, complete, kind_of, merge_rows, parse_ledger, plan_lines, read_notes,
                        render_ledger_report, rerender, stale_reasons)
from gpu_report import ledger_result, load_inputs, output_name, render_report  # noqa: E402  (torch-free)
from step_lanes import GpuMemorySampler  # noqa: E402  (torch-free)
from labkit.comm.stop import stop_group  # noqa: E402
from labkit.core.rundirs import run_path  # noqa: E402
FIXTURES = REPO / "tests" / "fixtures" / "gpu_check"
NOTEBOOK_CELL_TIMEOUT_S = 900
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


LENT_SLOT_DEADLINE_S = 560       # a lent GPU's 10-minute slot, less the report and the transfers
SLOT_GUARD_S = 3600              # a second start within this long of the first is refused (the fallback that re-ran)
LEDGER = REPO / "docs" / "gpu-report.md"


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


class SlotStopped(Exception):
    """A signal (SIGTERM from the slot's limit, SIGHUP) stopped the slot: the ledger is still written."""


def _raise_stop(signum: int, frame: object) -> None:
    raise SlotStopped(signal.Signals(signum).name)


def step_command(py: str, work: Path, step: str) -> tuple[str, ...]:
    """The command of one ledger step: nbval for a notebook (full mode), pytest for a test file, a benchmark as is."""
    out = str(work / output_name(step))
    if step.endswith(".ipynb"):
        return (py, "-m", "pytest", "-q", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
                f"--nbval-cell-timeout={NOTEBOOK_CELL_TIMEOUT_S}", f"--junitxml={out}", step)
    if step.startswith("tests/"):
        return (py, "-m", "pytest", "-q", "-p", "no:cacheprovider", step, f"--junitxml={out}")
    takes_json = '"--json"' in (REPO / step).read_text() if (REPO / step).is_file() else False
    return (py, step, "--json", out) if takes_json else (py, step)


def run_one(argv: tuple[str, ...], log: Path, limit_s: float, env: dict, cwd: Path,
            sampler: GpuMemorySampler | None = None) -> tuple[str, float, float | None]:
    """Run one step in its own session, stopped at ``limit_s``; (status, wall s, peak GPU MiB). Whatever stops
    the slot meanwhile (a signal, Ctrl-C) stops the step's whole process group first, then goes on up."""
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if sampler:
            sampler.watch(log.stem, proc.pid)
        try:
            proc.wait(timeout=max(0.0, limit_s))
            status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            status = f"stopped at its limit of {limit_s:.0f} s"
        finally:
            if proc.poll() is None:
                stop_group(proc)
            if sampler:
                sampler.unwatch(log.stem)
    peak = sampler.peaks.get(log.stem) if sampler and sampler.readable else None
    return status, round(time.monotonic() - started, 1), peak


def run_slot(chosen: list[Choice], *, work: Path, ledger: Path, deadline_s: float, device: str, commit: str,
             env: dict, py: str = sys.executable, sampler: GpuMemorySampler | None = None) -> list[str]:
    """Run the chosen steps one after another inside ``deadline_s``; after each (and whatever stops the slot)
    merge its row into the ledger and rewrite it. Returns each chosen step's fate (never started ones too)."""
    old_text = ledger.read_text() if ledger.is_file() else ""
    rows, notes = parse_ledger(old_text), read_notes(old_text)
    fates = {c.step: "never started (the deadline came first)" for c in chosen}
    date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    started = time.monotonic()

    def write() -> None:
        slot = [f"{date} UTC on {device}, commit `{commit[:10]}`, deadline {deadline_s:.0f} s:", ""]
        slot += [f"- `{c.step}` (budget {c.cost_s:.0f} s): {fates[c.step]}" for c in chosen]
        ledger.write_text(render_ledger_report(REPO, rows, deadline_s, slot=slot, notes=notes, as_of=commit))

    current = None
    try:
        for c in chosen:
            left = deadline_s - (time.monotonic() - started)
            if left <= 1:
                break
            current, step_started = c, time.monotonic()
            limit = min(left, max(2 * c.cost_s, c.cost_s + 60))      # an estimate twice wrong stops, the rest runs
            lessons = work / "lessons" / f"{Path(c.step).stem}.jsonl"
            lessons.parent.mkdir(parents=True, exist_ok=True)
            status, wall, peak = run_one(step_command(py, work, c.step), work / f"{Path(output_name(c.step)).stem}.log",
                                         limit, {**env, "LABKIT_LESSON_LOG": str(lessons)}, REPO, sampler)
            result, figures = ledger_result(c.step, status, work, lessons)
            if peak:
                figures = f"{figures}; peak GPU memory {peak:.0f} MiB".lstrip("; ")
            rows = merge_rows(rows, [LedgerRow(c.step, kind_of(c.step), device, commit, date, result, wall, figures)])
            fates[c.step], current = f"{status} in {wall:.0f} s: {result}", None
            write()
    except BaseException as err:            # a signal, Ctrl-C or a crash: the running step is recorded, then re-raised
        if current is not None:
            wall = round(time.monotonic() - step_started, 1)
            why = f"{NOT_FINISHED} (the slot was stopped: {type(err).__name__} {err})"
            rows = merge_rows(rows, [LedgerRow(current.step, kind_of(current.step), device, commit, date, why, wall)])
            fates[current.step] = f"{why} after {wall:.0f} s"
        raise
    finally:
        write()
    return [f"{step}: {fate}" for step, fate in fates.items()]


def slot_guard(stamp: Path, new_slot: bool) -> str | None:
    """Why this start is refused (a slot already started here within SLOT_GUARD_S), else None; writes the stamp."""
    if stamp.is_file() and not new_slot:
        try:
            before = json.loads(stamp.read_text())
        except json.JSONDecodeError:
            before = {"started": time.time(), "pid": "?"}
        if time.time() - before.get("started", 0) < SLOT_GUARD_S:
            return (f"a GPU check already started here at {time.strftime('%H:%M:%S', time.gmtime(before['started']))} "
                    f"UTC (pid {before.get('pid')}): this command never runs twice in one slot (pass --new-slot for "
                    "another slot); its ledger and work folder are left as they are")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"started": time.time(), "pid": os.getpid()}))
    return None


def head_commit() -> str:
    """This tree's commit (git, else $LABKIT_COMMIT: a lent box gets the tree without .git), or 'unknown'."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    return (out.stdout.strip() if out is not None and out.returncode == 0 else "") or \
        os.environ.get("LABKIT_COMMIT", "unknown")


def the_plan(ledger: Path, deadline_s: float, only: tuple[str, ...] = ()) -> tuple[list[Choice], str]:
    """The next slot's choice from the ledger and this tree's git history, and the plan as printed text."""
    rows = complete(parse_ledger(ledger.read_text()) if ledger.is_file() else [], all_steps(REPO))
    choices = choose_steps(rows, stale_reasons(REPO, rows), deadline_s, only)
    text = "\n".join(plan_lines(choices, deadline_s) + ["", f"Full mode against the {FULL_MODE_BUDGET_S:.0f} s "
                                                         "budget, per notebook:", ""] + budget_lines(REPO, rows))
    return choices, text

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


def live(args: argparse.Namespace) -> int:
    """One slot on this GPU: choose, run, merge, write the ledger whatever stops it; 1 if a step did not pass."""
    why = slot_guard(run_path("gpu-check.slot.json"), args.new_slot)
    if why:
        print(f"refused: {why}", file=sys.stderr)
        return 2
    work = run_path("gpu-check")
    previous = work.with_name("gpu-check.previous")     # an older slot's outputs are kept aside, never read as new
    shutil.rmtree(previous, ignore_errors=True)
    if work.exists():
        work.rename(previous)
    work.mkdir(parents=True, exist_ok=True)
    versions = machine_versions()
    (work / "versions.json").write_text(json.dumps(versions, indent=1))
    choices, text = the_plan(args.ledger, args.deadline_s, tuple(args.only))
    (work / "plan.txt").write_text(text)
    print(text, flush=True)
    chosen = [c for c in choices if c.chosen]
    handlers = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    sampler, fates, crash, started = GpuMemorySampler(), [], None, time.time()
    sampler.start()
    try:
        env = {**os.environ, **carried_wheels_env(work / "site"), "LABKIT_MODE": "full"}
        fates = run_slot(chosen, work=work, ledger=args.ledger, deadline_s=args.deadline_s,
                         device=versions["device"], commit=args.commit or head_commit(), env=env, sampler=sampler)
    except BaseException as err:             # the ledger is already written (run_slot's finally); say why it stopped
        crash = f"the slot stopped early: {type(err).__name__}: {err}"
    finally:
        sampler.stop()
        for s, h in handlers.items():
            signal.signal(s, h)
    ladder = run_path("ladder") / "ladder.json"          # notebook 10's climb saves its ladder here
    if ladder.is_file() and ladder.stat().st_mtime >= started:
        shutil.copyfile(ladder, work / "ladder.json")
    report = render_report(load_inputs(work, versions, notes=[text.split("\n")[0], *([crash] if crash else [])]))
    write_report(report, work / "report.md")
    print("\n".join(fates) + f"\nledger: {args.ledger}; this slot's figures: {work / 'report.md'}"
          + (f"; {crash}" if crash else ""))
    return 1 if crash or any(": ok " not in f for f in fates) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="print the next slot's steps, their budget each and the "
                        "total against the deadline, then exit (no GPU needed)")
    parser.add_argument("--dry-run", action="store_true", help="render from recorded fixtures even on a GPU box")
    parser.add_argument("--out", type=Path, help="the dry run's report (default runs/gpu-check/gpu-report-dry-run.md)")
    parser.add_argument("--ledger", type=Path, default=LEDGER, help="the ledger to read and merge into "
                        "(default docs/gpu-report.md)")
    parser.add_argument("--deadline-s", type=float, default=LENT_SLOT_DEADLINE_S, help="the slot's deadline: steps "
                        "are chosen to fit it and stopped at it (default: a lent GPU's 10-minute slot)")
    parser.add_argument("--only", nargs="*", default=[], help="consider only these steps (paths as in the ledger)")
    parser.add_argument("--commit", default="", help="the commit this tree is (default: git HEAD, else "
                        "$LABKIT_COMMIT; a lent box gets the tree without .git)")
    parser.add_argument("--render-ledger", action="store_true", help="render the ledger again from its own rows "
                        "(a new notebook gets its row, the stale list and the plan are brought up to date), then exit")
    parser.add_argument("--new-slot", action="store_true", help="start although a slot started here within the "
                        "hour (never in a fallback: that re-run lost the evidence of 27 November)")
    args = parser.parse_args(argv)
    if args.deadline_s <= 0:
        parser.error("--deadline-s must be positive: a slot always has a deadline")
    if args.render_ledger:
        args.ledger.write_text(rerender(REPO, args.ledger, args.deadline_s, head_commit()))
        print(f"rendered {args.ledger} again from its rows")
        return 0
    if args.plan:
        print(the_plan(args.ledger, args.deadline_s, tuple(args.only))[1])
        return 0
    if args.dry_run or not cuda_present():
        if not args.dry_run:
            print("no CUDA GPU on this machine: nothing to check live; dry run of the report writer and the plan")
        code = dry_run(args.out or run_path("gpu-check", "gpu-report-dry-run.md"))
        print(the_plan(args.ledger, args.deadline_s, tuple(args.only))[1])
        return code
    return live(args)


if __name__ == "__main__":
    sys.exit(main())
