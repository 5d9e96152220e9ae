"""A real Slurm cluster on the emulated nodes: ``slurmctld`` on node 0, one ``slurmd`` per node, munge for auth.

Debian's ``slurm-wlm`` runs a controller and node daemons on one machine; each ``slurmd`` here lives in its own
node's network stack (its own address, its own port 6818), so ``sbatch`` and ``srun`` see a cluster of N hosts
and place one task per node exactly as on a real one. Node names resolve through a hosts file bind-mounted over
``/etc/hosts`` inside the lab's private mount namespace only (the host's file is never touched), so the batch
script's ``scontrol show hostnames`` and torchrun's rendezvous at ``node0:29400`` work unchanged.
Everything lives in one temporary folder and every daemon is stopped with the lab.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from labkit.cluster.nodes import EmulatedNodes, node_address
from labkit.comm.stop import stop_group
from labkit.core.clock import Deadline, now_s
from labkit.core.machine import cpu_count

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "scancel", "munged")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin")
INSTALL_HINT = "as root: apt-get install slurm-wlm (Debian/Ubuntu)"


def find_program(name: str) -> str | None:
    """``name`` on PATH or in the sbin folders Debian installs daemons to."""
    found = shutil.which(name)
    if found:
        return found
    return next((str(Path(d) / name) for d in SBIN if (Path(d) / name).is_file()), None)


def slurm_support() -> tuple[bool, str]:
    """(can run, why not): the Slurm and munge programs are installed and this process is root."""
    missing = [p for p in PROGRAMS if find_program(p) is None]
    if missing:
        return False, f"Slurm is not installed ({', '.join(missing)} missing); {INSTALL_HINT}"
    if os.geteuid() != 0:
        return False, "the Slurm daemons of the emulated cluster run as root; run as root to try the batch script"
    return True, "slurm-wlm and munge found"


def node_name(node: int) -> str:
    """The Slurm (and host) name of emulated node ``node``."""
    return f"node{node}"


def slurm_conf(folder: Path, nodes: int, cpus: int) -> str:
    """A minimal slurm.conf: controller on node0, every node with its address, one partition, no cgroups."""
    f = folder
    lines = ["ClusterName=labkit", f"SlurmctldHost={node_name(0)}({node_address(0)})",
             "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={f / 'munge.sock'}",
             "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={f / 'state'}",
             f"SlurmdSpoolDir={f / 'spool-%n'}", f"SlurmctldPidFile={f / 'slurmctld.pid'}",
             f"SlurmdPidFile={f / 'slurmd-%n.pid'}", f"SlurmctldLogFile={f / 'slurmctld.log'}",
             f"SlurmdLogFile={f / 'slurmd-%n.log'}", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
             "JobAcctGatherType=jobacct_gather/none", "SchedulerType=sched/builtin", "SelectType=select/cons_tres",
             "SelectTypeParameters=CR_Core", "ReturnToService=2", "MpiDefault=none", "KillWait=5",
             *(f"NodeName={node_name(k)} NodeAddr={node_address(k)} CPUs={cpus} State=UNKNOWN" for k in range(nodes)),
             f"PartitionName=lab Nodes={','.join(node_name(k) for k in range(nodes))} Default=YES MaxTime=INFINITE "
             "State=UP"]
    return "\n".join(lines) + "\n"


def _named(node: int, argv: list[str]) -> list[str]:
    """``argv`` in a UTS namespace of its own whose host name is the node's: slurmctld checks it is the controller
    host, and every task a node daemon starts inherits it (``hostname`` prints node1 on node 1)."""
    return ["unshare", "-u", "sh", "-c", f'hostname {node_name(node)} && exec "$@"', "sh", *argv]


@dataclass
class BatchResult:
    """What ``sbatch --wait`` gave back: the job's exit code and its output file."""

    exit_code: int
    output: str
    wall_s: float


class SlurmOnNodes:
    """``with SlurmOnNodes(nodes) as slurm: slurm.sbatch(script)``: a Slurm cluster over the emulated nodes."""

    def __init__(self, nodes: EmulatedNodes, cpus: int | None = None, timeout_s: float = 30.0) -> None:
        ok, why = slurm_support()
        if not ok:
            raise RuntimeError(why)
        self.nodes, self.cpus, self.timeout_s = nodes, cpus or cpu_count(), timeout_s
        self.folder = Path(tempfile.mkdtemp(prefix="labkit-slurm-"))
        self.conf = self.folder / "slurm.conf"
        self._munged: subprocess.Popen | None = None
        self._daemons: list[subprocess.Popen] = []

    def __enter__(self) -> "SlurmOnNodes":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Hosts file, munge, the controller on node 0 and a node daemon on each node; wait until all are idle."""
        n = self.nodes.config.nodes
        hosts = self.folder / "hosts"
        hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{node_address(k)} {node_name(k)}\n" for k in range(n)))
        self.nodes.host_run(["mount", "--bind", str(hosts), "/etc/hosts"])     # the lab's mount namespace only
        for sub in ("state", *(f"spool-{node_name(k)}" for k in range(n))):
            (self.folder / sub).mkdir()
        self.conf.write_text(slurm_conf(self.folder, n, self.cpus))
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._munged = subprocess.Popen(
            [find_program("munged"), "-F", "-f", f"--socket={self.folder / 'munge.sock'}", f"--key-file={key}",
             f"--pid-file={self.folder / 'munged.pid'}", f"--log-file={self.folder / 'munged.log'}",
             f"--seed-file={self.folder / 'munge.seed'}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        self._daemon(0, [find_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for k in range(n):
            self._daemon(k, [find_program("slurmd"), "-D", "-f", str(self.conf), "-N", node_name(k)])
        self._wait_idle(n)

    def _daemon(self, node: int, argv: list[str]) -> None:
        """Start a daemon in node ``node``'s network stack with the node's host name. It enters with ``nsenter
        --net`` rather than ``ip netns exec``, which would mount a fresh /sys without the cgroup tree slurmd reads."""
        enter = [*self.nodes.enter_argv(), "nsenter", f"--net=/run/netns/lkn{node}", "--"]
        self._daemons.append(subprocess.Popen([*enter, *_named(node, argv)], stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              env=self.env(), start_new_session=True))

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of Slurm's commands: this config, and this Python's programs first on PATH."""
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", ""), *SBIN])
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path, **(extra or {})}

    def _run(self, argv: list[str], timeout_s: float, extra: Mapping[str, str] | None = None
             ) -> subprocess.CompletedProcess:
        return subprocess.run(self.nodes.node_argv(0, argv), capture_output=True, text=True, timeout=timeout_s,
                              env=self.env(extra))

    def _wait_idle(self, n: int) -> None:
        deadline, state = Deadline(self.timeout_s), ""
        while not deadline.expired:
            state = self._run([find_program("sinfo"), "-h", "-N", "-o", "%N %t"], 10).stdout
            if sum(line.split()[-1] == "idle" for line in state.splitlines() if line.strip()) == n:
                return
            time.sleep(0.3)
        log = (self.folder / "slurmctld.log").read_text(errors="replace")[-800:] if (
            self.folder / "slurmctld.log").exists() else ""
        raise TimeoutError(f"the Slurm nodes were not idle within {self.timeout_s:g} s (sinfo: {state.strip()!r}); "
                           f"slurmctld's log ends:\n{log}")

    def sbatch(self, script: str, timeout_s: float = 120.0, extra_env: Mapping[str, str] | None = None
               ) -> BatchResult:
        """Submit ``script`` from node 0 and wait for it to end (polling ``scontrol``: ``sbatch --wait`` sleeps up
        to half a minute between looks); its exit code and output. On timeout the job is cancelled."""
        path, out = self.folder / "job.sh", self.folder / "job.out"
        path.write_text(script)
        start, deadline = now_s(), Deadline(timeout_s)
        sub = self._run([find_program("sbatch"), "--parsable", "-o", str(out), "-D", str(self.folder), str(path)],
                        30, extra_env)
        if sub.returncode != 0:
            raise RuntimeError(f"sbatch refused the script: {sub.stderr.strip()[-500:]}")
        job_id = sub.stdout.strip().split(";")[0]
        while True:
            state, code = self._job_state(job_id)
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", ""):
                break
            if deadline.expired:
                self._run([find_program("scancel"), job_id], 30)
                raise TimeoutError(f"Slurm job {job_id} did not end within {timeout_s:g} s (state {state}); "
                                   "it was cancelled")
            time.sleep(0.2)
        output = out.read_text(errors="replace") if out.exists() else ""
        return BatchResult(code if state == "COMPLETED" or code else 1, output, now_s() - start)

    def _job_state(self, job_id: str) -> tuple[str, int]:
        """(JobState, the batch script's exit code) from ``scontrol show job``."""
        text = self._run([find_program("scontrol"), "show", "job", "-o", job_id], 30).stdout
        fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
        return fields.get("JobState", ""), int(fields.get("ExitCode", "0:0").split(":")[0])

    def close(self) -> None:
        """Stop munge (the node daemons die with the nodes' processes) and remove the folder."""
        self.nodes.kill_all()
        for proc in [*self._daemons, *([self._munged] if self._munged else [])]:
            stop_group(proc, reap_s=None)
        self._daemons, self._munged = [], None
        shutil.rmtree(self.folder, ignore_errors=True)
