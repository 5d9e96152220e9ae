"""A job that survives a lost replica without a restart: torchft replica groups on gloo, one SIGKILLed mid-run.

torchft (pytorch/torchft; optional, ``pip install torchft==0.2.*``) runs each replica group as a world of its own; a
lighthouse forms a quorum of the live groups before every step, and a group that stops heartbeating drops out of the
next one. Plain DDP under torchrun is one world: a lost rank fails the collective and the whole job restarts. Here one
group marks a step in a file, the parent SIGKILLs it, and the survivor's log says whether it trained on.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import psutil
import torch
from torch import nn

from labkit.comm.ports import free_port
from labkit.comm.stop import stop_group
from labkit.core.clock import Deadline, now_s, timestamp_s
from labkit.core.validation import checked_int, positive_int, positive_number
from labkit.core.verdict import CHECKED, FAILED, Verdict

POLL_S = 0.05
RIVAL_STOPS = "a lost replica stops the job (plain DDP under torchrun: the collective fails, every rank restarts)"
RIVAL_IDLES = "the survivor only idles or diverges after the kill"
CLAIMS = ("the surviving replica trained on past the kill without a restart",      # judge_survival
          "the survivor's loss kept falling after the kill")                       # judge_loss_falls


@dataclass(frozen=True)
class ReplicaConfig:
    """The run: replica groups, the step after which one is killed, the survivor's last step, and the model."""

    replicas: int = 2
    kill_after_step: int = 20
    steps: int = 60
    heartbeat_timeout_ms: int = 1000   # the lighthouse drops a silent group after this (torchft's default is 5 s)
    timeout_s: float = 90.0
    features: int = 16
    hidden: int = 32
    batch: int = 32
    lr: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("kill_after_step", "steps", "heartbeat_timeout_ms", "features", "hidden", "batch"):
            positive_int(getattr(self, name), name)
        checked_int(self.replicas, "replicas", minimum=2), checked_int(self.seed, "seed", minimum=0)
        positive_number(self.timeout_s, "timeout_s"), positive_number(self.lr, "lr")
        if self.steps <= self.kill_after_step:
            raise ValueError(f"steps ({self.steps}) must exceed kill_after_step ({self.kill_after_step})")

    @classmethod
    def fast(cls) -> "ReplicaConfig":
        """The notebook's and the tests' size: a few seconds of training after a few seconds of start-up."""
        return cls()


@dataclass
class ReplicaRecord:
    """The run: each group's steps (step, loss, participants, t: seconds since go, pid, committed) and the kill."""

    cfg: ReplicaConfig
    rows: dict[int, list[dict]]
    victim: int
    survivor: int                  # the group whose log the verdicts read (the first not killed)
    kill_step: int
    kill_t_s: float
    wall_s: float
    quorums: list[int]             # participants of each quorum the lighthouse issued, in order
    folder: str                    # the run's temporary folder (removed)
    lighthouse_port: int
    leftover_pids: list[int]


def torchft_missing_reason() -> str | None:
    """None when torchft can be imported here; otherwise the one line a skipped lesson or test prints."""
    return None if importlib.util.find_spec("torchft") is not None else (
        "torchft is not installed in this environment: `.venv/bin/pip install torchft==0.2.*` to run this lab")


def _batch(cfg: ReplicaConfig, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's batch of ``step``: seeded inputs and a fixed linear teacher's targets."""
    w = torch.randn(cfg.features, 1, generator=torch.Generator().manual_seed(cfg.seed))
    gen = torch.Generator().manual_seed(cfg.seed + 1000 * step + replica + 1)
    x = torch.randn(cfg.batch, cfg.features, generator=gen)
    return x, x @ w


def _manager(cfg: ReplicaConfig, replica: int, lighthouse: str, model: nn.Module, opt: torch.optim.Optimizer,
             store: torch.distributed.TCPStore) -> object:
    """torchft's Manager of a one-rank group on ``store`` (kept alive by the caller: the others connect to it)."""
    from torchft import Manager, ProcessGroupGloo  # lazy: optional package
    return Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1, init_sync=False,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["opt"])),
        state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
        replica_id=f"replica_{replica}", lighthouse_addr=lighthouse, hostname="127.0.0.1",
        store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
        timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=cfg.timeout_s))


def replica_main(cfg_json: str, replica: int, lighthouse: str, run_dir: str, victim: int) -> None:
    """One replica group (one rank): torchft ``Manager`` + ``ProcessGroupGloo`` + its DDP and optimizer wrapper,
    logging every step to ``run_dir``; the victim writes a mark after ``kill_after_step`` and waits to be killed."""
    from torchft import DistributedDataParallel, Optimizer  # lazy: optional package
    cfg, folder = ReplicaConfig(**json.loads(cfg_json)), Path(run_dir)
    deadline = Deadline(cfg.timeout_s)
    torch.manual_seed(cfg.seed)                 # every group starts from the same weights (init_sync=False)
    model = nn.Sequential(nn.Linear(cfg.features, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, 1))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    _wait_for((folder / "lighthouse_up").exists, {}, folder, deadline, "the lighthouse")
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = _manager(cfg, replica, lighthouse, model, opt, store)
    ddp, ft_opt = DistributedDataParallel(manager, model), Optimizer(manager, opt)
    (folder / f"ready_{replica}").touch()
    _wait_for((folder / "go").exists, {}, folder, deadline, "the other groups")
    while manager.current_step() < cfg.steps and not deadline.expired:
        step, (x, y) = manager.current_step(), _batch(cfg, step=manager.current_step(), replica=replica)
        ft_opt.zero_grad()                      # torchft's order: this starts the step's quorum, before the forward
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()                         # gradients averaged over the quorum's groups
        ft_opt.step()                           # the update, only if every group in the quorum committed
        row = {"step": manager.current_step(), "loss": loss.item(), "t": timestamp_s(), "pid": os.getpid(),
               "participants": manager.num_participants(), "committed": manager.current_step() > step}
        with (folder / f"steps_{replica}.jsonl").open("a") as f:     # closed each step: readable after a SIGKILL
            f.write(json.dumps(row) + "\n")
        if replica == victim and manager.current_step() == cfg.kill_after_step:
            (folder / "mark").write_text(f"{manager.current_step()} {os.getpid()}")
            time.sleep(deadline.remaining_s)        # the parent SIGKILLs this process here
    manager.shutdown(wait=False)
    (folder / f"done_{replica}").touch()


def _start(code: str, folder: Path, name: str, args: tuple[str, ...] = ()) -> subprocess.Popen:
    """A child python running ``code`` as a script (``args`` reach it) in a session of its own; output: name.txt."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    (folder / f"{name}.py").write_text(code)
    with (folder / f"{name}.txt").open("w") as out:
        return subprocess.Popen([sys.executable, str(folder / f"{name}.py"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=folder)


def _start_lighthouse(cfg: ReplicaConfig, port: int, folder: Path) -> subprocess.Popen:
    """torchft's lighthouse in its own process (its quorum log in ``lighthouse.txt``); a quorum needs 1 group."""
    args = ("--bind", f"127.0.0.1:{port}", "--min_replicas", "1", "--join_timeout_ms", "1000",
            "--heartbeat_timeout_ms", str(cfg.heartbeat_timeout_ms))     # the binary reads the process's own argv
    [lib] = Path(importlib.util.find_spec("torchft").submodule_search_locations[0]).glob("_torchft*.so")
    code = ("import importlib.machinery as m, importlib.util as u\n"     # the Rust extension alone: no torch
            f"loader = m.ExtensionFileLoader('torchft._torchft', {str(lib)!r})\n"
            "lib = u.module_from_spec(u.spec_from_loader(loader.name, loader))\n"
            "loader.exec_module(lib)\nlib.lighthouse_main()\n")
    return _start(code, folder, "lighthouse", args)


def serve_replicas(cfg_json: str, lighthouse: str, run_dir: str, victim: int) -> None:
    """Fork every replica group from this process, which imported torch once (the groups share those pages, as in
    ``labkit.comm.forkserver``); exit at once if a group fails, else when all are gone (the victim: SIGKILLed)."""
    pids = []
    for replica in range(ReplicaConfig(**json.loads(cfg_json)).replicas):
        if (pid := os.fork()) == 0:
            torch.set_num_threads(1)
            try:
                replica_main(cfg_json, replica, lighthouse, run_dir, victim)
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os._exit(0 if (Path(run_dir) / f"done_{replica}").exists() else 1)
        pids.append(pid)
    while pids:
        pid, status = os.wait()
        pids.remove(pid)
        if os.waitstatus_to_exitcode(status) not in (0, -signal.SIGKILL):
            os._exit(1)                         # the parent reports the traceback and kills the rest


def _wait_for(done: Callable[[], bool], procs: dict, folder: Path, deadline: Deadline, what: str) -> None:
    """Poll until ``done()``; a child that exited or the deadline passing is one clear line."""
    while not done():
        dead = [name for name, p in procs.items() if p.poll() is not None]
        if dead or deadline.expired:
            out = folder / f"{dead[0]}.txt" if dead else folder
            lines = (out.read_text(errors="replace").strip().splitlines() if out.is_file() else []) or ["no output"]
            why = f"{dead[0]} exited ({lines[-1]})" if dead else f"timed out after {deadline.timeout_s:g} s"
            raise RuntimeError(f"torchft replicas: {why} while waiting for {what}")
        time.sleep(POLL_S)


def quorum_sizes(lighthouse_log: str) -> list[int]:
    """Participants of each quorum the lighthouse issued, in order, read from its log."""
    return [line.count("QuorumMember {") for line in lighthouse_log.splitlines() if "Quorum! Quorum {" in line]


def _kill_after_mark(procs: dict, folder: Path, deadline: Deadline, victim: int) -> tuple[float, float]:
    """Start the groups at once, SIGKILL the victim once it marked its step, wait for the rest; (t0, kill_t)."""
    _wait_for(lambda: "listening" in (folder / "lighthouse.txt").read_text(), procs, folder, deadline, "the lighthouse")
    (folder / "lighthouse_up").touch()
    _wait_for(lambda: all((folder / f"ready_{r}").exists() for r in range(victim + 1)), procs, folder, deadline,
              "every group to start")
    t0 = timestamp_s()
    (folder / "go").touch()
    _wait_for((folder / "mark").exists, procs, folder, deadline, f"replica {victim} to mark its step")
    os.kill(int((folder / "mark").read_text().split()[1]), signal.SIGKILL)
    kill_t = timestamp_s() - t0
    _wait_for(lambda: procs["replicas"].poll() == 0, procs, folder, deadline, "the survivors to finish")
    return t0, kill_t


def run_replicas(cfg: ReplicaConfig | None = None) -> ReplicaRecord:
    """Start a lighthouse, launch ``cfg.replicas`` one-rank replica groups, SIGKILL the last one right after it
    marks ``cfg.kill_after_step``, let the others finish ``cfg.steps``; every process and the temp folder removed."""
    if (reason := torchft_missing_reason()) is not None:
        raise RuntimeError(reason)
    cfg = cfg or ReplicaConfig.fast()
    folder, victim = Path(tempfile.mkdtemp(prefix="labkit-replicas-")), cfg.replicas - 1
    start, deadline, port = now_s(), Deadline(cfg.timeout_s), free_port()
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["lighthouse"] = _start_lighthouse(cfg, port, folder)
        code = (f"import labkit; from labkit.checkpoint.replicas import serve_replicas; serve_replicas("
                f"{json.dumps(cfg.__dict__)!r}, 'http://127.0.0.1:{port}', {str(folder)!r}, {victim})")
        procs["replicas"] = _start(code, folder, "replicas")
        t0, kill_t = _kill_after_mark(procs, folder, deadline, victim)
        rows = {r: [{**row, "t": row["t"] - t0} for row in map(json.loads, (folder / f"steps_{r}.jsonl").read_text()
                                                                 .splitlines())] for r in range(cfg.replicas)}
        quorums = quorum_sizes((folder / "lighthouse.txt").read_text(errors="replace"))
        kill_step = int((folder / "mark").read_text().split()[0])
    finally:
        for proc in procs.values():
            stop_group(proc, grace_s=2.0)
        shutil.rmtree(folder, ignore_errors=True)
    pids = {p.pid for p in procs.values()} | {r["pid"] for rs in rows.values() for r in rs}     # all reaped by now
    return ReplicaRecord(cfg, rows, victim, 0, kill_step, kill_t, now_s() - start, quorums, str(folder), port,
                         sorted(pid for pid in pids if still_ours(pid, folder)))


def still_ours(pid: int, folder: Path) -> bool:
    """Is ``pid`` still one of this run's processes? Every one ran a script in ``folder`` (the replicas forked from
    it), so its command line names the folder; a pid the kernel has since given to another program does not (a
    busy machine reuses pids within seconds, and a bare pid_exists called that a leftover)."""
    try:
        return str(folder) in " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def steps_after_kill(record: ReplicaRecord, replica: int) -> list[dict]:
    """The committed steps ``replica`` logged after the kill."""
    return [r for r in record.rows[replica] if r["committed"] and r["t"] > record.kill_t_s]


def judge_survival(record: ReplicaRecord) -> Verdict:
    """The survivor trained on past the kill, in one process, its quorum shrunk to the rest (rival: RIVAL_STOPS)."""
    claim, rep = CLAIMS[0], record.survivor
    rows, after = record.rows[rep], steps_after_kill(record, rep)
    before = [r["participants"] for r in rows if r["t"] <= record.kill_t_s]    # the last: the quorum at the kill
    pids, parts_after = sorted({r["pid"] for r in rows}), sorted({r["participants"] for r in after})
    pid, last = pids[0] if len(pids) == 1 else pids, rows[-1]["step"] if rows else 0
    holds = (len(pids) == 1 and len(after) > 0 and before[-1:] == [record.cfg.replicas] and
             parts_after == [record.cfg.replicas - 1] and last >= record.cfg.steps)
    detail = (f"replica {record.victim} SIGKILLed after step {record.kill_step}; replica {rep} (pid {pid}, one "
              f"process) logged {len(after)} steps after it, to step {last}; participants {before[-1:]} -> "
              f"{parts_after}; the lighthouse's quorums: {record.quorums[:1]} ... {record.quorums[-1:]} groups; "
              f"rival: {RIVAL_STOPS} would log 0 steps after the kill")
    return Verdict(claim, CHECKED if holds else FAILED, detail, rival=RIVAL_STOPS)


def judge_loss_falls(record: ReplicaRecord, window: int = 10) -> Verdict:
    """The survivor's median loss, last ``window`` steps against the ``window`` before the kill (rival: RIVAL_IDLES)."""
    rep = record.survivor
    before = [r["loss"] for r in record.rows[rep] if r["committed"] and r["t"] <= record.kill_t_s][-window:]
    after = [r["loss"] for r in steps_after_kill(record, rep)][-window:]
    m_before, m_after = (float(torch.tensor(xs).median()) if xs else float("nan") for xs in (before, after))
    detail = (f"median loss {m_before:.3g} over the {len(before)} steps before the kill, {m_after:.3g} over the last "
              f"{len(after)} after it (need {window} each); rival: {RIVAL_IDLES} (no steps, or a median at least "
              f"{m_before:.3g})")
    holds = len(before) == len(after) == window and m_after < m_before
    return Verdict(CLAIMS[1], CHECKED if holds else FAILED, detail, rival=RIVAL_IDLES)


def replicas_figure(record: ReplicaRecord) -> plt.Figure:
    """Step against time per replica group (top) and its quorum's participants (bottom), the kill marked."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.2), sharex=True, height_ratios=(3, 1.2))
    for rep, rows in record.rows.items():
        t, label = [r["t"] for r in rows], f"replica {rep}" + (" (SIGKILLed)" if rep == record.victim else "")
        top.plot(t, [r["step"] for r in rows], ".-", label=label)
        bottom.plot(t, [r["participants"] for r in rows], ".")
    dropped_t = record.kill_t_s + record.cfg.heartbeat_timeout_ms / 1000     # the lighthouse stops waiting for it
    _ = [ax.axvline(record.kill_t_s, color="red", ls="--", lw=1) for ax in (top, bottom)]
    bottom.axvline(dropped_t, color="gray", ls=":", lw=1)
    top.annotate(f"SIGKILL after step {record.kill_step}", (record.kill_t_s, record.kill_step), color="red",
                 xytext=(5, 5), textcoords="offset points")
    bottom.annotate("heartbeat timeout", (dropped_t, 1.5), color="gray", xytext=(-100, 0), textcoords="offset points")
    top.set(ylabel="committed step"), top.legend(loc="lower right")
    bottom.set(ylabel="participants", yticks=range(1, record.cfg.replicas + 1),
               xlabel="seconds since the groups started training")
    fig.tight_layout()
    return fig
