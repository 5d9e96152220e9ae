"""Imbalance is a straggler: a router skewed towards one expert makes its rank compute more, and every other rank
waits for it in the combine all-to-all.

On real ranks, the same expert-parallel MoE runs forward with its balanced router and with the router skewed towards
expert 0 (rank 0's), in interleaved rounds (each round runs both, between barriers, in alternating order). Each rank
reports per round the token-copies its experts computed, the seconds in its experts, the seconds waiting in the
combine, and the step's seconds; its CPU share over the rounds goes to the verdict. The capacity factor is E/k
here, so nothing is dropped and the hot rank computes everything it is sent (a smaller factor caps it: see
:func:`labkit.parallel.experts.balance.capacity_sweep`).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.verdict import INCONCLUSIVE, Load, Rival, Verdict, judge_at_least, relative_spread
from labkit.parallel.experts.balance import skew_router
from labkit.parallel.experts.dispatch import ExpertParallelMoE
from labkit.parallel.experts.moe import MoE, MoEConfig

ROUTERS = ("balanced", "skewed")
STEP_CLAIM = ("every rank's step slows with the skewed router, by at least half the busiest rank's extra expert "
              "time (measured in the same rounds)")
STEP_RIVAL = Rival("the same tokens make the same step", 1.0)


def straggler_worker(config_dict: dict, tokens: int, rounds: int = 5, skew_bias: float = 2.0, seed: int = 0) -> dict:
    """Run inside ``launch``: forward steps with the balanced and the skewed router, timed in interleaved rounds."""
    torch.set_num_threads(1)
    config, rank, ep, device = MoEConfig(**config_dict), dist.get_rank(), dist.get_world_size(), rank_device()
    config = replace(config, capacity_factor=config.experts / config.top_k)     # capacity = tokens: none dropped
    reference = MoE(config, seed)
    parts = {"balanced": ExpertParallelMoE(reference, rank, ep).to(device)}
    skew_router(reference, 0, skew_bias)
    parts["skewed"] = ExpertParallelMoE(reference, rank, ep).to(device)
    gen = torch.Generator().manual_seed(seed + 10 + rank)
    x = torch.randn(tokens, config.hidden, generator=gen).to(device)
    record = {name: {"copies": [], "expert_s": [], "combine_s": [], "step_s": []} for name in ROUTERS}
    with torch.no_grad():
        for name in ROUTERS:                                        # warm-up
            parts[name](x)
        with ShareMeter() as meter:
            for r in range(rounds):
                for name in (ROUTERS if r % 2 == 0 else ROUTERS[::-1]):
                    dist.barrier()
                    start = now_s()
                    parts[name](x)
                    step_s = now_s() - start
                    last = parts[name].last
                    for key, value in (("copies", sum(last["received_per_expert"])), ("expert_s", last["expert_s"]),
                                       ("combine_s", last["combine_s"]), ("step_s", step_s)):
                        record[name][key].append(value)
    return {"rank": rank, "ep": ep, "record": record, "cpu_share": meter.share,
            "received_per_expert": parts["skewed"].last["received_per_expert"], "first": parts["skewed"].first}


def run_straggler(config: MoEConfig, ep: int, tokens: int, rounds: int = 5, skew_bias: float = 2.0,
                  timeout_s: float = 120.0, backend: str = "auto") -> list[dict]:
    """Launch the straggler rounds on ``ep`` real processes; one result per rank."""
    config.experts_per_rank(ep)
    return launch(straggler_worker, ep, args=(asdict(config), tokens, rounds, skew_bias), timeout_s=timeout_s,
                  show_output=False, backend=backend)


def hot_and_cold(ranks: list[dict]) -> tuple[dict, dict]:
    """(the rank whose experts computed the most copies under the skewed router, the one that computed the fewest)."""
    by_copies = sorted(ranks, key=lambda r: r["record"]["skewed"]["copies"][0])
    return by_copies[-1], by_copies[0]


def straggler_rows(ranks: list[dict]) -> list[dict]:
    """One row per (router, rank): copies computed, median seconds in the experts, waiting in the combine, the step."""
    rows = []
    for name in ROUTERS:
        for r in ranks:
            rec = r["record"][name]
            rows.append({"router": name, "rank": r["rank"], "copies": rec["copies"][0],
                         **{f"{k}_ms": 1e3 * statistics.median(rec[k]) for k in ("expert_s", "combine_s", "step_s")}})
    return rows


def compute_ratio_by_round(ranks: list[dict]) -> list[float]:
    """Per round, under the skewed router: the hot rank's seconds in its experts over the cold rank's."""
    hot, cold = hot_and_cold(ranks)
    h, c = hot["record"]["skewed"]["expert_s"], cold["record"]["skewed"]["expert_s"]
    return [a / max(b, 1e-9) for a, b in zip(h, c)]


def wait_share_by_round(ranks: list[dict]) -> list[float]:
    """Per round, under the skewed router: how much of the hot rank's extra compute the cold rank spent waiting in
    the combine (its wait minus the hot rank's, over the compute gap); kept above zero for the verdict."""
    hot, cold = hot_and_cold(ranks)
    hs, cs = hot["record"]["skewed"], cold["record"]["skewed"]
    shares = []
    for he, ce, hw, cw in zip(hs["expert_s"], cs["expert_s"], hs["combine_s"], cs["combine_s"]):
        shares.append(max(cw - hw, 1e-9) / max(he - ce, 1e-9))
    return shares


def straggler_load(ranks: list[dict]) -> Load:
    """How busy the rounds were: each rank's CPU share, and the spread of the hot/cold compute ratio over rounds."""
    return Load.of_ranks(ranks, spread=relative_spread(compute_ratio_by_round(ranks)))


def step_slowdown_by_round(ranks: list[dict]) -> list[tuple[float, float]]:
    """Per round: (the skewed step over the balanced one, 1 + half the busiest rank's extra expert seconds over the
    balanced step): the prediction, measured in the same round, that the whole step waits for the busiest rank."""
    def busiest(name: str, key: str, i: int) -> float:
        return max(r["record"][name][key][i] for r in ranks)

    pairs = []
    for i in range(len(ranks[0]["record"]["skewed"]["step_s"])):
        balanced_step = busiest("balanced", "step_s", i)
        extra = busiest("skewed", "expert_s", i) - busiest("balanced", "expert_s", i)
        pairs.append((busiest("skewed", "step_s", i) / balanced_step, 1 + max(extra, 0.0) / 2 / balanced_step))
    return pairs


def judge_step_slowdown(ranks: list[dict], load: Load) -> Verdict:
    """:data:`STEP_CLAIM` on the paired rounds, against :data:`STEP_RIVAL`. Its threshold is measured too: where the
    median round shows the busiest rank no extra expert time, the threshold is the rival's 1x and the clock cannot
    tell them apart. On a busy run that is its load blurring the expert times (a starved rank's balanced round
    looks as slow as the hot rank's skewed one): INCONCLUSIVE. On a quiet run the skew itself did not show: failed."""
    slow = step_slowdown_by_round(ranks)
    step_ratio, threshold = (sorted(v)[len(v) // 2] for v in zip(*slow))
    if threshold <= STEP_RIVAL.value and load.busy:
        return Verdict(STEP_CLAIM, INCONCLUSIVE, f"measured {step_ratio:.3g}x; the busiest rank showed no extra "
                                                 f"expert time under the skewed router in the median round, so the "
                                                 f"threshold is the rival's {STEP_RIVAL.value:g}x: {load.reason()}",
                       kind=load.kind, rival=STEP_RIVAL.name)
    return judge_at_least(STEP_CLAIM, step_ratio, threshold, load=load, by_round=slow, rival=STEP_RIVAL)
