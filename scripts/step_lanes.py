"""Run a check's steps in lanes of CPUs inside a deadline, noting each step's wall time and peak GPU memory.

Why: a lent GPU comes for minutes, and `make gpu-check` run one step after another takes longer. Steps that
need the GPU to themselves (a timing benchmark) run first, alone; the rest share the machine in lanes, each lane
pinned to its own CPUs, so one lane's thread pools never spin on another lane's cores (the kit sizes its threads
from the CPUs a process may use). A step still running at the deadline is stopped and says so; a step never
started is listed as not run. Torch-free: GPU memory is read from ``nvidia-smi``, per process, and summed over
each step's process tree (a notebook's kernel, a benchmark's ranks).
"""
from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import psutil

from labkit.core.clock import now_s
from labkit.comm.stop import stop_group


@dataclass(frozen=True)
class Step:
    """One command of a check. ``cost_s``: the planner's estimate; ``alone``: runs before the lanes, by itself;
    ``gpu_timing``: times work on the GPU, so it runs in the first lane, one such step at a time (another process
    on the GPU slices its kernels: a many-kernel version of a job slows more than a fused one, and a timing
    lesson fails for a reason that is not its own); ``stdout``: a file for its output, else the runner's own."""

    name: str
    argv: tuple[str, ...]
    cost_s: float = 60.0
    alone: bool = False
    stdout: str | None = None
    gpu_timing: bool = False


@dataclass
class StepRecord:
    """What became of one step; ``status`` is ok, failed (exit N), stopped at the deadline or not run."""

    name: str
    lane: str
    cpus: str
    started_s: float | None = None
    wall_s: float | None = None
    returncode: int | None = None
    status: str = "not run (deadline)"
    gpu_peak_mib: float | None = None
    gpu_timing: bool = False

    def to_dict(self) -> dict:
        """The record as steps.json holds it."""
        return asdict(self)


def split_cpus(cpus: list[int], lanes: int) -> list[list[int]]:
    """``lanes`` disjoint, nearly equal CPU sets (contiguous, so a lane keeps to one socket where it can)."""
    if lanes < 1:
        raise ValueError(f"lanes must be at least 1, got {lanes}")
    lanes = min(lanes, len(cpus))
    size, extra = divmod(len(cpus), lanes)
    out, start = [], 0
    for i in range(lanes):
        end = start + size + (i < extra)
        out.append(cpus[start:end])
        start = end
    return out


def plan_lanes(steps: list[Step], lanes: int) -> list[list[Step]]:
    """GPU-timing steps all go to the first lane (the GPU's, in the given order); every other step, in the given
    (priority) order, to the lane with the least estimated work so far, the first lane only when it is the only one."""
    plan: list[list[Step]] = [[] for _ in range(max(1, lanes))]
    load = [0.0] * len(plan)
    others = range(1, len(plan)) if len(plan) > 1 else range(1)
    for step in steps:
        i = 0 if step.gpu_timing else min(others, key=lambda k: (load[k], k))
        plan[i].append(step)
        load[i] += step.cost_s
    return plan


def cpu_label(cpus: list[int]) -> str:
    """'0-3' for a run of CPUs, '0,2,5' otherwise, '7' for one."""
    if len(cpus) == 1:
        return str(cpus[0])
    return f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus))


def read_gpu_process_memory() -> dict[int, float] | None:
    """MiB of GPU memory per process id, from ``nvidia-smi``; None where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    usage: dict[int, float] = {}
    for line in out.stdout.splitlines():
        pid, _, mib = line.partition(",")
        try:
            usage[int(pid)] = usage.get(int(pid), 0.0) + float(mib)
        except ValueError:
            continue                                # "[N/A]" where the driver hides a process's usage
    return usage


class GpuMemorySampler(threading.Thread):
    """Every ``interval_s``: each running step's GPU memory (its process tree's sum); keeps each step's peak."""

    def __init__(self, interval_s: float = 1.0, read: Callable[[], dict[int, float] | None] = read_gpu_process_memory):
        super().__init__(daemon=True)
        self.interval_s, self.read = interval_s, read
        self.roots: dict[str, int] = {}
        self.peaks: dict[str, float] = {}
        self.readable = True
        self._stop_event, self._lock = threading.Event(), threading.Lock()

    def watch(self, name: str, pid: int) -> None:
        """Count the GPU memory of ``pid`` and its descendants as step ``name``'s."""
        with self._lock:
            self.roots[name] = pid
            self.peaks.setdefault(name, 0.0)

    def unwatch(self, name: str) -> None:
        """Stop sampling step ``name`` (its peak is kept)."""
        with self._lock:
            self.roots.pop(name, None)

    def sample(self) -> None:
        """One reading: each watched step's current total, kept where it is its peak so far."""
        usage = self.read()
        if usage is None:
            self.readable = False
            return
        with self._lock:
            roots = dict(self.roots)
        for name, pid in roots.items():
            try:
                proc = psutil.Process(pid)
                family = {pid} | {p.pid for p in proc.children(recursive=True)}
            except psutil.NoSuchProcess:
                continue
            total = sum(mib for p, mib in usage.items() if p in family)
            with self._lock:
                self.peaks[name] = max(self.peaks.get(name, 0.0), total)

    def run(self) -> None:
        """The thread: a sample every ``interval_s`` until :meth:`stop`."""
        while not self._stop_event.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        """Ask the thread to end after its current sample."""
        self._stop_event.set()


def _run_one(step: Step, record: StepRecord, cpus: list[int], env: dict, cwd: Path, t0: float, deadline: float | None,
             sampler: GpuMemorySampler | None) -> None:
    now = now_s()
    if deadline is not None and now >= deadline:
        return                                          # stays "not run (deadline)"
    record.started_s = round(now - t0, 1)
    print(f"$ [{record.lane} cpus {record.cpus}] {' '.join(step.argv)}", flush=True)
    out = open(step.stdout, "w") if step.stdout else None
    try:
        proc = subprocess.Popen(step.argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    except OSError as err:
        record.status, record.wall_s = f"failed to start ({err.strerror or err})", 0.0
        if out:
            out.close()
        return
    if sampler:
        sampler.watch(step.name, proc.pid)
    try:
        proc.wait(timeout=None if deadline is None else max(0.0, deadline - now_s()))
        record.returncode = proc.returncode
        record.status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        stop_group(proc)
        proc.wait()
        record.status = "stopped at the deadline"
    finally:
        record.wall_s = round(now_s() - t0 - record.started_s, 1)
        if sampler:
            sampler.unwatch(step.name)
            record.gpu_peak_mib = sampler.peaks.get(step.name) if sampler.readable else None
        if out:
            out.close()
    print(f"  [{record.lane}] {step.name}: {record.status} in {record.wall_s:.0f} s", flush=True)


def run_steps(steps: list[Step], *, lanes: int = 1, deadline_s: float | None = None, env: dict | None = None,
              cwd: str | Path = ".", cpus: list[int] | None = None,
              sampler: GpuMemorySampler | None = None) -> list[StepRecord]:
    """Run ``alone`` steps one by one on every CPU, then the rest in ``lanes`` pinned lanes; records in input order."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    env = dict(os.environ if env is None else env)
    t0 = now_s()
    deadline = None if deadline_s is None else t0 + deadline_s
    records = {s.name: StepRecord(s.name, "alone" if s.alone else "", "", gpu_timing=s.gpu_timing and not s.alone)
               for s in steps}
    if len(records) != len(steps):
        raise ValueError("step names must be unique")
    for step in (s for s in steps if s.alone):
        records[step.name].cpus = cpu_label(cpus)
        _run_one(step, records[step.name], cpus, env, Path(cwd), t0, deadline, sampler)
    lane_cpus = split_cpus(cpus, lanes)
    plan = plan_lanes([s for s in steps if not s.alone], len(lane_cpus))

    def lane_worker(i: int) -> None:
        for step in plan[i]:
            records[step.name].lane, records[step.name].cpus = f"lane {i + 1}", cpu_label(lane_cpus[i])
            _run_one(step, records[step.name], lane_cpus[i] if len(lane_cpus) > 1 else cpus, env, Path(cwd), t0,
                     deadline, sampler)

    threads = [threading.Thread(target=lane_worker, args=(i,)) for i in range(len(plan))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, lane in enumerate(plan):
        for step in lane:
            records[step.name].lane = records[step.name].lane or f"lane {i + 1}"
            records[step.name].cpus = records[step.name].cpus or cpu_label(lane_cpus[i])
    return [records[s.name] for s in steps]
