"""Emulated nodes: two stacks with their own addresses, a shaped uplink, and nothing left behind on any exit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from labkit.cluster.nodes import EmulatedNodes, NodesConfig, namespaces_alive, node_address, wait_all

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gone(ids: list[str], holder_pid: int, scratch: str | None = None) -> None:
    assert namespaces_alive(ids) == [], "a node's network namespace outlived the lab"
    assert scratch is None or not os.path.exists(scratch), "the nodes' scratch folder outlived the lab"
    assert not os.path.exists(f"/proc/{holder_pid}") or open(f"/proc/{holder_pid}/stat").read().split()[2] == "Z"


def test_config_is_validated_with_one_clear_line():
    with pytest.raises(ValueError, match="nodes must be"):
        NodesConfig(nodes=0)
    with pytest.raises(ValueError, match="rate_mbit_s must be a number > 0"):
        NodesConfig(rate_mbit_s=-5)
    assert NodesConfig(rate_mbit_s=8.0).rate_bytes_s == 1e6
    assert node_address(1) == "10.77.0.2"


def test_nodes_have_their_own_stacks_a_shaped_link_and_vanish_on_exit(namespaces_here):
    with EmulatedNodes(NodesConfig(nodes=2, rate_mbit_s=100)) as nodes:
        ids = nodes.namespace_ids()
        holder, scratch = nodes._holder.pid, str(nodes.scratch)
        assert nodes.run(1, ["ls", "-d", scratch]).strip() == scratch      # the nodes see their local disks
        assert len(set(ids)) == 2 and os.readlink("/proc/self/ns/net") not in ids
        assert "10.77.0.2/24" in nodes.run(1, ["ip", "-br", "addr", "show", "eth0"])
        assert "rate 100Mbit" in nodes.run(0, ["tc", "qdisc", "show", "dev", "eth0"])
        sleeper = nodes.popen(0, ["sleep", "60"])
        deadline = time.monotonic() + 15        # nsenter and `ip netns exec` enter the node before exec'ing sleep
        while sleeper.pid not in nodes.pids(0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleeper.pid in nodes.pids(0)
        with pytest.raises(ValueError, match="node must be an integer in 0..1"):
            nodes.run(2, ["true"])
    assert sleeper.poll() is not None
    _gone(ids, holder, scratch)
    assert "10.77.0" not in subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout


def test_an_error_inside_the_block_tears_everything_down(namespaces_here):
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedNodes(NodesConfig()) as nodes:
            ids, holder, scratch = nodes.namespace_ids(), nodes._holder.pid, str(nodes.scratch)
            nodes.popen(1, ["sleep", "60"])
            raise RuntimeError("boom")
    _gone(ids, holder, scratch)


def test_kill_all_empties_a_node_that_keeps_forking(namespaces_here):
    """One look-then-kill pass loses to a process that forks between the look and the kill (a launcher mid-restart,
    a worker spawning its loader): kill_all looks again until the nodes are empty."""
    with EmulatedNodes(NodesConfig()) as nodes:
        forker = nodes.popen(0, ["sh", "-c", "while true; do sleep 60 & done"])
        deadline = time.monotonic() + 15
        while len(nodes.pids(0)) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(nodes.pids(0)) >= 20
        assert nodes.kill_all() == []
        assert nodes.pids(0) == [] and nodes.pids(1) == []
        forker.wait(timeout=10)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_killed_lab_leaves_no_namespace_or_process(namespaces_here, how):
    code = textwrap.dedent("""
        import time
        from labkit.cluster.nodes import EmulatedNodes, NodesConfig
        with EmulatedNodes(NodesConfig()) as nodes:
            sleeper = nodes.popen(1, ["sleep", "60"])
            print(nodes._holder.pid, sleeper.pid, nodes.scratch, *nodes.namespace_ids(), flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    holder, sleeper, scratch, *ids = proc.stdout.readline().split()
    proc.send_signal(how)
    assert proc.wait(timeout=20) != 0
    procs = [int(holder), int(sleeper)]
    wait_all([], 1.0)
    for _ in range(50):                         # after kill -9 the holder notices within 0.2 s and cleans up
        if not namespaces_alive(ids) and not os.path.exists(scratch) and not any(os.path.exists(f"/proc/{p}/cmdline") and
                                                 open(f"/proc/{p}/cmdline").read() for p in procs):
            break
        subprocess.run(["sleep", "0.2"])
    assert namespaces_alive(ids) == []
    assert not os.path.exists(scratch), "the nodes' scratch folder outlived a killed lab"
    assert not any(os.path.exists(f"/proc/{p}/cmdline") and open(f"/proc/{p}/cmdline").read() for p in procs)


def test_link_counters_and_rate_change(namespaces_here):
    with EmulatedNodes(NodesConfig(rate_mbit_s=None)) as nodes:
        assert "tbf" not in nodes.run(0, ["tc", "qdisc", "show", "dev", "eth0"])
        nodes.set_rate(50)
        assert "rate 50Mbit" in nodes.run(1, ["tc", "qdisc", "show", "dev", "eth0"])
        before = nodes.link_bytes()[0]["tx_bytes"]
        nodes.run(0, [sys.executable, "-c", "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                      "s.sendto(b'x' * 1000, ('10.77.0.2', 9))"])
        assert nodes.link_bytes()[0]["tx_bytes"] - before >= 1000


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_without_root_the_nodes_live_in_a_user_namespace_or_say_why():
    code = ("from labkit.cluster.nodes import EmulatedNodes, NodesConfig, namespace_support, namespaces_alive\n"
            "mode, why = namespace_support()\n"
            "if mode is None:\n    print('UNAVAILABLE', why)\nelse:\n"
            "    with EmulatedNodes(NodesConfig()) as n:\n"
            "        ids = n.namespace_ids(); out = n.run(1, ['tc', 'qdisc', 'show', 'dev', 'eth0'])\n"
            "    print(n.mode, 'tbf' in out, namespaces_alive(ids))\n")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if subprocess.run([*nobody, "test", "-r", os.path.join(REPO, "labkit", "__init__.py")]).returncode != 0:
        pytest.skip(f"the unprivileged user cannot read this checkout ({REPO}; a folder above it is private, "
                    "e.g. made by mktemp -d): clone into a readable folder to run this test")
    proc = subprocess.run([*nobody, sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO}, cwd="/")
    assert proc.returncode == 0, proc.stderr[-1500:]
    out = proc.stdout.strip()
    assert out == "user True []" or (out.startswith("UNAVAILABLE") and len(out.splitlines()) == 1), out
