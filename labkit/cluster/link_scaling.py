"""What the link between nodes does to scaling: sync SGD across the nodes, predicted from the fitted link and timed.

The node lab's job (:func:`labkit.cluster.link_jobs.sync_sgd_across`) trains notebook 07's MLP with synchronous SGD
on rank 0 alone and on one rank per node, in interleaved rounds at each link speed, so every gradient all-reduce
crosses the shaped link. Here the model of notebook 07 (``labkit.parallel.data.costmodel``: replicas pay when
T_sync < (R-1) T_comp, Goyal et al. 2017) predicts each speed-up from two numbers of the *same* job: T_comp of the
lone rank and T_sync of a ring all-reduce of the gradients priced on the inter-node alpha and beta fitted from the
ping-pongs (Patarasuk & Yuan 2009 for the ring's 2(R-1) steps of n/R bytes). The clock gives the measured speed-up
R x (lone step) / (step across the nodes); the verdict reads the CPU shares of those same rounds.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from labkit.cluster.linkfit import LinkFit
from labkit.cluster.rankside import rate_key
from labkit.comm.collectives import allreduce_cost
from labkit.core.verdict import NOT_CHECKED, Load, Rival, Verdict, judge_agreement, judge_at_least
from labkit.parallel.data.costmodel import core_sharing_slowdown, predicted_speedup
from labkit.parallel.data.scaling import StepTimes, runs_load
from labkit.parallel.data.speedup import FLOPS_PER_PARAM_PER_SAMPLE, ExplorerSettings

AGREEMENT = 0.35   # the band for "model and clock agree": two fitted link terms and one compute time, on shared cores
MODEL_MARGIN = 1.1  # the slow-link claim needs the model to price the links this far apart: its bar, halfway to the
                    # rival 1.0x, would otherwise sit under 5%, inside the spread of a quiet run's rounds


def sgd_runs(results: Sequence[dict], rate_mbit_s: float) -> tuple[StepTimes, StepTimes]:
    """(rank 0 alone, one rank per node) at one link speed, from rank 0's report."""
    rank0 = next(r for r in results if r["rank"] == 0)
    alone, across = (StepTimes(**run) for run in rank0["by_rate"][rate_key(rate_mbit_s)]["sync_sgd"])
    return alone, across


def sgd_row(results: Sequence[dict], inter: LinkFit, rate_mbit_s: float, cores: int) -> dict[str, Any]:
    """One link speed: T_comp, T_sync predicted from the fitted link and measured, the speed-up both ways."""
    alone, across = sgd_runs(results, rate_mbit_s)
    link = inter.link()
    t_sync = allreduce_cost("ring", across.world_size, across.grad_bytes, link.alpha_s, link.beta_s_per_byte)
    slowdown = core_sharing_slowdown(across.world_size, cores)
    return {"link (Mbit/s)": rate_mbit_s, "replicas": across.world_size, "gradients (MB)": across.grad_bytes / 1e6,
            "T_comp (ms)": alone.t_comp_s * 1e3, "T_sync model (ms)": t_sync * 1e3,
            "T_sync measured (ms)": across.t_sync_s * 1e3,
            "speedup model": predicted_speedup(alone.t_comp_s, t_sync, across.world_size, slowdown),
            "slowdown": slowdown,
            "speedup measured": across.world_size * alone.step_s / across.step_s,
            "worst CPU share": min(alone.cpu_share, across.cpu_share)}


def sgd_load(results: Sequence[dict], rate_mbit_s: float, cores: int) -> Load:
    """How busy that speed's rounds were: each run's worst CPU share and step spread (``parallel.data.scaling``)."""
    return runs_load(sgd_runs(results, rate_mbit_s), cores)


def link_free_speedup(row: dict[str, Any]) -> float:
    """The rival of the link's price: notebook 07's speed-up with T_sync = 0, as if the link cost nothing."""
    return predicted_speedup(row["T_comp (ms)"] / 1e3, 0.0, row["replicas"], row["slowdown"])


def judge_speedup(claim: str, row: dict[str, Any], load: Load) -> Verdict:
    """The speed-up predicted from T_comp and the fitted link agrees with the clock (within ``AGREEMENT``), and the
    band rejects the rival 'the link costs nothing' (:func:`link_free_speedup`). Where the model itself lies within
    the band of that rival, the link is too cheap at this speed for the clock to tell them apart: NOT CHECKED."""
    model, free = row["speedup model"], link_free_speedup(row)
    if model / (1.0 + AGREEMENT) <= free <= model * (1.0 + AGREEMENT):
        return Verdict(claim, NOT_CHECKED, f"the link is too cheap at {row['link (Mbit/s)']:g} Mbit/s to tell the "
                                           f"model ({model:.2f}x) from a free link ({free:.2f}x) within "
                                           f"±{AGREEMENT:.0%}")
    return judge_agreement(claim, model, row["speedup measured"], tolerance=AGREEMENT, load=load,
                           rival=Rival("the link costs nothing (T_sync = 0)", free))


def judge_slow_link_costs(claim: str, slow: dict[str, Any], fast: dict[str, Any], load: Load) -> Verdict:
    """The slower link gives the smaller speed-up: the model says so (else failed) and the clock agrees.

    The model's half compares the two links at one compute time, the lone rank's median over both speeds: the link
    is the only difference the claim is about. Each speed's own T_comp comes from its own rounds, and a neighbour
    that slowed one of them could reorder the two speed-ups with no help from the link (a CI-like run under a
    load of 7 on 2 cores read 1.65x on the slow link and 1.58x on the fast one that way)."""
    t_comp_s = (slow["T_comp (ms)"] + fast["T_comp (ms)"]) / 2e3
    model = {name: predicted_speedup(t_comp_s, row["T_sync model (ms)"] / 1e3, row["replicas"], row["slowdown"])
             for name, row in (("slow", slow), ("fast", fast))}
    said = (f"at one T_comp of {t_comp_s * 1e3:.1f} ms the model gives {model['slow']:.2f}x on the slow link and "
            f"{model['fast']:.2f}x on the fast one (T_sync {slow['T_sync model (ms)']:.1f} against "
            f"{fast['T_sync model (ms)']:.1f} ms)")
    if model["slow"] > model["fast"] * MODEL_MARGIN:
        return Verdict(claim, "failed", said)
    if model["fast"] < model["slow"] * MODEL_MARGIN:
        return Verdict(claim, NOT_CHECKED, f"{said}: the fitted links price the two speeds within "
                                           f"{MODEL_MARGIN - 1:.0%}, so there is no modelled cost for the clock to "
                                           "confirm against its rival 'the link speed does not matter'")
    # the bar sits halfway (geometrically) between the rival 'the link does not matter' (1.0x) and the model's ratio
    bar = math.sqrt(model["fast"] / model["slow"])
    return judge_at_least(claim, fast["speedup measured"] / slow["speedup measured"], bar, load=load,
                          rival=Rival("the link speed does not matter (1.0x)", 1.0))


def combined_load(loads: Sequence[Load]) -> Load:
    """Both speeds' rounds as one load: every share, the larger spread."""
    shares = {f"{name} ({i + 1})": v for i, load in enumerate(loads) for name, v in load.shares.items()}
    return Load(shares, spread=max((load.spread for load in loads), default=0.0))


def explorer_settings(results: Sequence[dict], fits: dict[str, LinkFit], rate_mbit_s: float,
                      ranks_per_node: int, nodes: int) -> ExplorerSettings:
    """The speedup explorer opened on this lab: its MLP and batch, the lone rank's compute rate, the fitted
    loopback inside a node and the fitted link between nodes."""
    alone, _ = sgd_runs(results, rate_mbit_s)
    params = alone.grad_bytes / 4                                    # fp32 gradients
    intra, inter = fits["intra"].link(), fits["inter"].link()
    return ExplorerSettings(world_size=nodes * ranks_per_node, batch=alone.batch, model_params_m=params / 1e6,
                            latency_us=intra.alpha_s * 1e6, bandwidth_gb_s=1e-9 / intra.beta_s_per_byte,
                            ranks_per_node=ranks_per_node, inter_latency_us=inter.alpha_s * 1e6,
                            inter_bandwidth_gb_s=1e-9 / inter.beta_s_per_byte, algorithm="flat",
                            device_flops_per_s=FLOPS_PER_PARAM_PER_SAMPLE * params * alone.batch / alone.t_comp_s)
