"""Emulated nodes on one Linux box: network namespaces joined by a switch, each node's uplink shaped by ``tc tbf``.

A network namespace is a whole network stack (its own interfaces, addresses, routes, sockets), so N of them are
N hosts as far as every socket knows. The lab builds them inside a private *holder*: one ``unshare`` process with
its own mount and network namespaces (plus a user namespace when not root, ``unshare -Urnm``). The holder's network
namespace is the switch (a bridge ``br0``); each node ``lkn<k>`` is a named namespace with ``eth0`` (address
10.77.0.<k+1>) on a veth to that bridge and ``lo`` up, so traffic inside a node stays on its fast loopback while
traffic between nodes leaves through ``eth0``, whose egress a token-bucket filter holds to the chosen rate (``tc``'s
``netem`` delay is not available everywhere, so the lab sets bandwidth and measures latency).

Teardown is guaranteed three ways: ``close()`` (the ``with`` block's exit, on error and Ctrl-C), SIGTERM turned into
an exit while the nodes are up, and the holder itself, which watches its parent and, when it disappears (even after
``kill -9``), kills what is left in the nodes, deletes them and ``scratch``. Nothing is ever created in the host's own
network namespace, and ``/run/netns`` is a private tmpfs, so other users' namespaces are never seen or touched.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from labkit.comm.stop import stop_group
from labkit.core.clock import Deadline
from labkit.core.validation import positive_int, positive_number

SUBNET = "10.77.0"          # a private range, used only inside the lab's own namespaces
BITS_PER_MBIT = 1_000_000
_HOLDER_SCRIPT = r"""
set -e
mkdir -p /run/netns 2>/dev/null || { mount -t tmpfs labkit /run; mkdir -p /run/netns; }
mount -t tmpfs labkit /run/netns
ip link set lo up
ip link add br0 type bridge
ip link set br0 up
echo ready
set +e
while kill -0 "$1" 2>/dev/null && [ -e /proc/"$1" ]; do sleep 0.2; done
for ns in $(ip netns list | cut -d' ' -f1); do
  for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null; done
  ip netns del "$ns"
done
rm -rf "$2"
"""


class NodesUnavailable(RuntimeError):
    """This machine cannot build separate network stacks (no root and no unprivileged user namespaces)."""


@dataclass(frozen=True)
class NodesConfig:
    """How many nodes, and the inter-node link: rate in Mbit/s (None: unshaped), tbf burst and queue in bytes."""

    nodes: int = 2
    rate_mbit_s: float | None = 200.0
    burst_bytes: int = 64 * 1024       # one 64 KiB GSO packet; small, so the rate holds from the first message
    limit_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        positive_int(self.nodes, "nodes", maximum=200, hint="one address per node in 10.77.0.0/24")
        if self.rate_mbit_s is not None:
            positive_number(self.rate_mbit_s, "rate_mbit_s", hint="the inter-node link in Mbit/s, or None")
        positive_int(self.burst_bytes, "burst_bytes")
        positive_int(self.limit_bytes, "limit_bytes")

    @classmethod
    def fast(cls) -> "NodesConfig":
        """Two nodes on a 200 Mbit/s link: slow enough to dominate gloo's loopback, quick to measure."""
        return cls(nodes=2, rate_mbit_s=200.0)

    @property
    def rate_bytes_s(self) -> float | None:
        """The shaped rate in bytes per second (None when unshaped)."""
        return None if self.rate_mbit_s is None else self.rate_mbit_s * BITS_PER_MBIT / 8


def node_address(node: int) -> str:
    """Node ``node``'s address on the emulated network (10.77.0.<node+1>)."""
    return f"{SUBNET}.{node + 1}"


def namespace_support() -> tuple[str | None, str]:
    """('root' or 'user', how) when separate network stacks can be built here, else (None, one-line reason)."""
    if missing := [tool for tool in ("ip", "tc", "unshare", "nsenter") if shutil.which(tool) is None]:
        return None, f"{', '.join(missing)} not found: install iproute2 and util-linux"
    mode = "root" if os.geteuid() == 0 else "user"
    argv = ["unshare", "-m", "-n", "true"] if mode == "root" else ["unshare", "-Urnm", "true"]
    try:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"unshare failed ({err})"
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["refused"])[-1]
        return None, (f"cannot create a {'' if mode == 'root' else 'user+'}network namespace here ({why}); "
                      "run as root or enable unprivileged user namespaces")
    return mode, "as root" if mode == "root" else "in an unprivileged user+network namespace (unshare -Urnm)"


class EmulatedNodes:
    """N emulated hosts with a shaped link between them: ``with EmulatedNodes(NodesConfig()) as nodes: ...``."""

    def __init__(self, config: NodesConfig, timeout_s: float = 30.0) -> None:
        self.config, self.timeout_s = config, positive_number(timeout_s, "timeout_s")
        self.mode: str | None = None
        self._holder: subprocess.Popen | None = None
        self._procs: list[subprocess.Popen] = []
        self._previous_sigterm: Any = None
        self.scratch: Path | None = None     # the nodes' local disks: a temporary folder, from start() to close()

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> "EmulatedNodes":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> "EmulatedNodes":
        """Build the switch, the nodes and the shaped link; raises NodesUnavailable with the reason if it cannot."""
        mode, why = namespace_support()
        if mode is None:
            raise NodesUnavailable(why)
        self.mode = mode
        self._arm_sigterm()
        try:
            self.scratch = Path(tempfile.mkdtemp(prefix="labkit-nodes-"))
            self._start_holder()
            for node in range(self.config.nodes):
                self._add_node(node)
            self.set_rate(self.config.rate_mbit_s)
        except BaseException:
            self.close()
            raise
        return self

    def _start_holder(self) -> None:
        flags = "-mn" if self.mode == "root" else "-Urnm"
        self._holder = subprocess.Popen(["unshare", flags, "--propagation", "private", "sh", "-c", _HOLDER_SCRIPT,
                                         "holder", str(os.getpid()), str(self.scratch)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                        text=True, start_new_session=True)
        line = self._holder.stdout.readline() if self._holder.stdout else ""
        if line.strip() != "ready":
            err = self._holder.stderr.read() if self._holder.stderr else ""
            raise NodesUnavailable(f"the namespace holder did not start: {err.strip()[-300:] or 'no output'}")

    def _add_node(self, node: int) -> None:
        ns, port = f"lkn{node}", f"sw{node}"
        for argv in (["ip", "netns", "add", ns],
                     ["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns],
                     ["ip", "link", "set", port, "master", "br0", "up"],
                     ["ip", "-n", ns, "addr", "add", f"{node_address(node)}/24", "dev", "eth0"],
                     ["ip", "-n", ns, "link", "set", "eth0", "up"],
                     ["ip", "-n", ns, "link", "set", "lo", "up"]):
            self.host_run(argv)

    def close(self) -> None:
        """Kill every process the nodes run, delete the nodes, the switch and ``scratch``; safe to call twice."""
        for proc in self._procs:
            stop_group(proc)
        self._procs.clear()
        holder, self._holder = self._holder, None
        if holder is not None:
            if holder.poll() is None:
                with contextlib.suppress(Exception):
                    for node in range(self.config.nodes):
                        for pid in self.pids(node, _holder=holder):
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
            stop_group(holder)
            for stream in (holder.stdout, holder.stderr):
                if stream is not None:
                    stream.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self._disarm_sigterm()

    def _arm_sigterm(self) -> None:
        """While the nodes are up, SIGTERM unwinds like Ctrl-C, so ``close()`` runs (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        self._previous_sigterm = signal.signal(signal.SIGTERM, stop)

    def _disarm_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # ------------------------------------------------------------------ commands
    def _enter(self, holder: subprocess.Popen | None = None) -> list[str]:
        holder = holder or self._holder
        if holder is None or holder.poll() is not None:
            raise RuntimeError("the emulated nodes are not running: use `with EmulatedNodes(config) as nodes:`")
        user = ["-U", "--preserve-credentials"] if self.mode == "user" else []
        return ["nsenter", "-t", str(holder.pid), *user, "-m", "-n", "--"]

    def enter_argv(self) -> list[str]:
        """The command prefix that enters the lab's namespaces (the switch side; add ``ip netns exec lkn<k>``)."""
        return self._enter()

    def host_run(self, argv: Sequence[str], timeout_s: float | None = None,
                 _holder: subprocess.Popen | None = None) -> str:
        """Run a command on the switch side (the holder's namespaces); its stdout, or one clear error."""
        proc = subprocess.run([*self._enter(_holder), *argv], capture_output=True, text=True,
                              timeout=timeout_s or self.timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def node_argv(self, node: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on node ``node`` (inside its network namespace)."""
        self._check_node(node)
        return [*self._enter(), "ip", "netns", "exec", f"lkn{node}", *argv]

    def run(self, node: int, argv: Sequence[str], timeout_s: float | None = None) -> str:
        """Run a short command on one node and return its stdout (a clear error if it fails or times out)."""
        proc = subprocess.run(self.node_argv(node, argv), capture_output=True, text=True,
                              timeout=timeout_s or self.timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"node {node}: `{' '.join(argv)}` failed: {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def popen(self, node: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start a long command on one node (its own session); ``close()`` kills it if it is still running."""
        proc = subprocess.Popen(self.node_argv(node, argv), start_new_session=True, stdin=subprocess.DEVNULL,
                                **kwargs)
        self._procs.append(proc)
        return proc

    def pids(self, node: int, _holder: subprocess.Popen | None = None) -> list[int]:
        """Host pids of every process running in node ``node``'s namespace."""
        out = self.host_run(["ip", "netns", "pids", f"lkn{node}"], _holder=_holder)
        return [int(p) for p in out.split()]

    def kill_all(self, timeout_s: float = 10.0) -> list[int]:
        """SIGKILL every process on any node (the lab's last word after a job), looking again until every node is
        empty or ``timeout_s`` (a large process stays listed as it exits; a launcher may fork between look and kill)."""
        deadline = Deadline(timeout_s)
        while True:
            left = [pid for node in range(self.config.nodes) for pid in self.pids(node)]
            if not left or deadline.expired:
                return left
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def _check_node(self, node: int) -> None:
        if not (isinstance(node, int) and 0 <= node < self.config.nodes):
            raise ValueError(f"node must be an integer in 0..{self.config.nodes - 1}, got {node!r}")

    # ------------------------------------------------------------------ the link
    def set_rate(self, rate_mbit_s: float | None) -> None:
        """Shape every node's uplink (eth0 egress) to ``rate_mbit_s`` Mbit/s with tbf; None removes the shaping."""
        argv = tbf_argv(rate_mbit_s, self.config.burst_bytes, self.config.limit_bytes)
        for node in range(self.config.nodes):
            with contextlib.suppress(RuntimeError):      # deleting a qdisc that is not there fails: fine
                self.host_run(["ip", "netns", "exec", f"lkn{node}", *argv])
        self.rate_mbit_s = rate_mbit_s

    def link_bytes(self) -> dict[int, dict[str, int]]:
        """Bytes each node's eth0 has sent and received so far (the veth's own counters: the slow link's traffic)."""
        out = {}
        for node in range(self.config.nodes):
            stats = json.loads(self.host_run(["ip", "-n", f"lkn{node}", "-s", "-j", "link", "show", "eth0"]))[0]
            out[node] = {"tx_bytes": int(stats["stats64"]["tx"]["bytes"]),
                         "rx_bytes": int(stats["stats64"]["rx"]["bytes"])}
        return out

    def namespace_ids(self) -> list[str]:
        """The kernel's id of each node's network namespace ('net:[inode]'), to prove later that they are gone."""
        return [self.run(node, ["readlink", "/proc/self/ns/net"]).strip() for node in range(self.config.nodes)]


def tbf_argv(rate_mbit_s: float | None, burst_bytes: int, limit_bytes: int, dev: str = "eth0") -> list[str]:
    """The ``tc`` command that shapes ``dev``'s egress to ``rate_mbit_s`` (None: remove the shaping)."""
    if rate_mbit_s is None:
        return ["tc", "qdisc", "del", "dev", dev, "root"]
    positive_number(rate_mbit_s, "rate_mbit_s", hint="Mbit/s, or None for an unshaped link")
    return ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit_s * 1000:.0f}kbit",
            "burst", str(burst_bytes), "limit", str(limit_bytes)]


def namespaces_alive(ids: Sequence[str]) -> list[str]:
    """Which of these network namespaces some process still holds (scans /proc; [] once torn down)."""
    wanted, alive = set(ids), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{entry}/ns/net")
                if link in wanted:
                    alive.add(link)
    return sorted(alive)


def wait_all(procs: Sequence[subprocess.Popen], timeout_s: float) -> list[int | None]:
    """Exit codes of ``procs`` once all ended, or None for those still running at the timeout (then killed)."""
    deadline = Deadline(positive_number(timeout_s, "timeout_s"))
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.01, deadline.remaining_s))
    codes = [proc.poll() for proc in procs]
    for proc, code in zip(procs, codes):
        if code is None:
            stop_group(proc)
    return codes
