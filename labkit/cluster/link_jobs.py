"""Rank-side jobs of the node lab: who am I, what does each link cost, flat vs two-level all-reduce.

Run under ``labkit launch --nnodes ...`` (see :mod:`labkit.cluster.run`), one call per rank; each reports JSON
through :func:`labkit.cluster.rankside.report`. The two-level all-reduce reduces inside each node, all-reduces
across nodes among one leader per node, and broadcasts inside (the hierarchical scheme of e.g. Horovod's
hierarchical allreduce, Sergeev & Del Balso 2018, arXiv 1802.05799); the flat one is gloo's all-reduce over every
rank. Bytes over the slow link are read from the node's own ``eth0`` counters (``/sys/class/net``, which
``ip netns exec`` shows for the node's namespace).
"""
from __future__ import annotations

import subprocess
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from labkit.cluster.nodes import tbf_argv
from labkit.cluster.rankside import Place, address_is_local, job_params, place, rate_key, report
from labkit.comm.mesh import Mesh, new_groups
from labkit.core.clock import interleaved, now_s
from labkit.core.contention import ShareMeter
from labkit.parallel.data.scaling import member_groups, sweep_members

ETH_STATS = Path("/sys/class/net/eth0/statistics")


def join_node_group() -> Place:
    """Join the launcher's process group (gloo, one thread per rank) and return this rank's place."""
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return place()


def _whoami(me: Place) -> dict:
    """RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE and the node's address (printed, and checked to be this stack's)."""
    total = torch.tensor([float(me.rank + 1)])
    dist.all_reduce(total)
    print(f"RANK={me.rank} LOCAL_RANK={me.local_rank} GROUP_RANK={me.group_rank} WORLD_SIZE={me.world_size} "
          f"node address {me.node_addr}", flush=True)
    return {**me.as_dict(), "owns_node_addr": address_is_local(me.node_addr), "all_reduce_sum": float(total.item())}


def identity() -> dict:
    """Report this rank's place and node address, and check one all-reduce across the nodes."""
    me = join_node_group()
    return report(_whoami(me), me.rank)


def tx_bytes() -> int:
    """Bytes this node's eth0 (its uplink to the switch) has sent so far."""
    return int((ETH_STATS / "tx_bytes").read_text())


def timed_placements(steps: dict, rounds: int) -> tuple[dict, float]:
    """Each placement's step (a :class:`labkit.core.step.TrainStep` with its ``feed``) warmed up once, then timed in
    interleaved rounds, the order rotating every round so no placement always runs first: seconds per step between
    two barriers (the slowest rank's) and this node's eth0 bytes per step, its counter read between two barriers
    (a rank that read it after the other rank of its node began sending missed those bytes: 521,578 of 524,288) -> ({name: {"step_s", "tx_bytes"}}, this
    rank's CPU share over the rounds). One loop for the TP and the EP placements (:mod:`labkit.cluster.tp_mesh`,
    :mod:`labkit.cluster.ep_mesh`)."""
    names = list(steps)
    for step in steps.values():
        step(*step.feed)                                    # warm-up: connections, buffers
    out: dict = {name: {"step_s": [], "tx_bytes": []} for name in names}
    with ShareMeter() as meter:
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                dist.barrier()
                before = tx_bytes()
                dist.barrier()          # every rank of the node has read its counter before any of them sends
                start = now_s()
                steps[name](*steps[name].feed)
                dist.barrier()
                out[name]["step_s"].append(now_s() - start)
                out[name]["tx_bytes"].append(tx_bytes() - before)
    return out, meter.share


def ping_pong_s(peer: int, nbytes: int, me: int, repeats: int) -> list[float]:
    """One-way seconds per message between this rank and ``peer`` (half a round trip), ``repeats`` times."""
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    times = []
    for _ in range(repeats + 1):                # the first round trip warms the connection up
        start = now_s()
        if me < peer:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        times.append((now_s() - start) / 2)
    return times[1:]


def _ping_pong_sweep(me: Place, sizes: dict[str, list[int]], repeats: int
                     ) -> tuple[dict[str, dict[int, list[float]]], dict[str, float]]:
    """Ping-pong between rank 0 and its node peer (inside a node), then rank 0 and node 1's first rank (across):
    the one-way times per link and size, and the CPU share each of the pair's ranks got during its link's sweep
    (what the fitted link is judged with: a rank starved of its core answers late, and the link looks slow)."""
    pairs = {"intra": (0, 1), "inter": (0, me.local_world_size)}
    out: dict[str, dict[int, list[float]]] = {}
    shares: dict[str, float] = {}
    for link, pair in pairs.items():
        out[link] = {}
        with ShareMeter() as meter:
            for nbytes in sizes[link]:
                if me.rank in pair:
                    peer = pair[1] if me.rank == pair[0] else pair[0]
                    out[link][nbytes] = ping_pong_s(peer, nbytes, me.rank, repeats)
                dist.barrier()
        if me.rank in pair:
            shares[link] = meter.share
    return out, shares


def make_groups(me: Place) -> tuple[object, object]:
    """(this node's group, the group of node leaders: local rank 0 of each node, None on the others); every rank
    creates both. The nodes
    are a mesh whose "tp" groups are a node's ranks (node-major numbering) and whose first "dp" group holds the
    leaders (:mod:`labkit.comm.mesh`)."""
    nodes = Mesh(dp=me.world_size // me.local_world_size, tp=me.local_world_size)
    inside, leaders = nodes.members("tp"), nodes.members("dp")[0]
    *local, lead = new_groups([*inside, leaders])
    return next(g for g in local if g is not None).group, (lead.group if lead is not None else None)


def hierarchical_all_reduce(tensor: torch.Tensor, me: Place, local: object, leaders: object) -> torch.Tensor:
    """Two-level all-reduce in place: reduce to the node leader, all-reduce among leaders, broadcast inside."""
    leader = me.group_rank * me.local_world_size
    dist.reduce(tensor, dst=leader, group=local)
    if me.local_rank == 0:
        dist.all_reduce(tensor, group=leaders)
    dist.broadcast(tensor, src=leader, group=local)
    return tensor


def _timed(fn: object, tensor_fn: object) -> tuple[float, int, bool]:
    """Seconds until this rank holds the result, this node's eth0 bytes sent, and whether it is the exact sum."""
    tensor, expected = tensor_fn()
    dist.barrier()
    before = tx_bytes()
    dist.barrier()                              # the node's other rank must not send before this counter is read
    start = now_s()
    fn(tensor)
    elapsed = now_s() - start
    dist.barrier()                              # every rank done: the node's counter holds the whole exchange
    return elapsed, tx_bytes() - before, bool(torch.equal(tensor, expected))


def flat_vs_hierarchical(me: Place, sizes: list[int], rounds: int, groups: tuple[object, object]
                         ) -> dict[int, dict[str, list]]:
    """For each size: per-round (seconds, bytes this node sent, exact?) of the flat and the two-level all-reduce."""
    local, leaders = groups
    out = {}
    for nbytes in sizes:
        n = max(1, nbytes // 4)

        def data() -> tuple[torch.Tensor, torch.Tensor]:
            # small integers in float32: every order of summation gives the exact same sum
            base = torch.arange(n, dtype=torch.float32) % 7
            expected = base * me.world_size + sum(range(me.world_size))
            return base + me.rank, expected

        runs = {"flat": lambda: _timed(dist.all_reduce, data),
                "hierarchical": lambda: _timed(lambda t: hierarchical_all_reduce(t, me, local, leaders), data)}
        out[nbytes] = interleaved(runs, rounds=rounds + 1)      # the first round warms up the connections
    return out


def shape_own_link(me: Place, rate_mbit_s: float, params: dict) -> None:
    """Every node's first rank re-shapes its own uplink (it is root in its node's namespace); all wait for it."""
    dist.barrier()
    if me.local_rank == 0:
        subprocess.run(tbf_argv(rate_mbit_s, int(params["burst_bytes"]), int(params["limit_bytes"])), check=True,
                       capture_output=True, timeout=30)
    dist.barrier()


# notebook 07's MLP: 0.54 MB of fp32 gradients, about 17 ms of compute per step on one core at batch 2048
SGD_DEFAULTS = dict(in_features=256, hidden=256, depth=2, batch=2048, steps=8, warmup=2, seed=0, rounds=3)


def sync_sgd_members(me: Place) -> dict[int, list[int]]:
    """Who trains in the scaling rounds: rank 0 alone, then one rank per node (every all-reduce crosses the link)."""
    nodes = me.world_size // me.local_world_size
    return {1: [0], nodes: [node * me.local_world_size for node in range(nodes)]}


def sync_sgd_across(me: Place, params: dict, groups: dict[int, object]) -> list[dict]:
    """Sync SGD of notebook 07's MLP alone and across the nodes in interleaved rounds: rank 0 returns T_comp, T_sync
    and the step time of each (``labkit.parallel.data.scaling``: same one step, same phase timing, same CPU-share meter)."""
    cfg = {**SGD_DEFAULTS, **params.get("sgd", {})}
    rounds = int(cfg.pop("rounds"))
    runs = sweep_members(sync_sgd_members(me), groups, rounds, cfg)
    return [asdict(run) for run in runs]


def link_lab() -> dict:
    """The whole link lesson in one job, at each link speed: ping-pong sweeps on both links, flat vs two-level
    all-reduce, then sync SGD alone vs across the nodes. Results per speed under ``by_rate['<Mbit/s>']``."""
    me = join_node_group()
    who = _whoami(me)
    params = job_params()
    repeats, rounds = int(params.get("repeats", 3)), int(params.get("rounds", 3))
    sizes = {"intra": params.get("intra_sizes", [8, 2**20, 2**22, 2**24]),    # loopback: GB/s, so larger
             "inter": params.get("inter_sizes", [8, 2**19, 2**20, 2**21])}    # 8 B for alpha; past tbf's burst
    groups = make_groups(me)
    sgd_groups = member_groups(sync_sgd_members(me))
    by_rate = {}
    for rate in params.get("rates_mbit_s", [None]):
        if rate is not None:
            shape_own_link(me, float(rate), params)
        pings, ping_shares = _ping_pong_sweep(me, {k: [int(s) for s in v] for k, v in sizes.items()}, repeats)
        allreduce = flat_vs_hierarchical(me, [int(s) for s in params.get("allreduce_sizes", [4096, 1048576])],
                                         rounds, groups)
        sgd = sync_sgd_across(me, params, sgd_groups)
        by_rate[rate_key(rate)] = {"ping_pong_s": pings, "ping_pong_cpu_share": ping_shares, "allreduce": allreduce,
                                   "sync_sgd": sgd}
        done = report({**who, "by_rate": by_rate}, me.rank)     # each speed at once: a timeout keeps it
    return done

