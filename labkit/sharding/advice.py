"""A decision table: model size, GPU memory, interconnect -> DDP / ZeRO-2 / FSDP (ZeRO-3) / + checkpointing.

Each row is computed, never typed: model-state bytes per rank from ZeRO's formulas
(``labkit.sharding.memory.zero_paper_bytes``), activations from the scenario (the kit's measured memory model
or a meta-device count, :mod:`labkit.sharding.lm_footprint`) shrunk by the measured or counted checkpointing ratio,
forward time from counted FLOPs, and communication time per step from
``labkit.sharding.comm_volume`` over the given link bandwidth. The rule: take the cheapest option that fits, in the
order DDP, ZeRO-2 (same traffic as DDP), FSDP, FSDP + checkpointing; where ZeRO-2 + checkpointing fits and
FSDP's extra all-gather costs more than one recomputed forward, prefer it.
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit.core.validation import positive_int, positive_number
from labkit.sharding.comm_volume import predicted_bytes_per_step
from labkit.sharding.lm_footprint import LMFootprint, forward_seconds
from labkit.sharding.memory import zero_paper_bytes

MIXED_PRECISION_GRAD_BYTES = 2     # fp16/bf16 gradients are what the collectives move


@dataclass(frozen=True)
class Scenario:
    """What a learner knows before training: model, GPUs, link, activations and compute per step."""

    name: str
    num_params: int
    gpu_memory_bytes: int
    world_size: int
    link_bytes_per_s: float
    activation_bytes_per_rank: int
    checkpointed_activation_fraction: float
    forward_s: float

    def __post_init__(self) -> None:
        positive_int(self.num_params, "num_params")
        positive_int(self.gpu_memory_bytes, "gpu_memory_bytes")
        positive_int(self.world_size, "world_size")
        positive_number(self.link_bytes_per_s, "link_bytes_per_s")
        for name in ("activation_bytes_per_rank", "forward_s"):      # measured figures: floats are fine
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {getattr(self, name)!r}")
        if not 0 < self.checkpointed_activation_fraction <= 1:
            raise ValueError(f"checkpointed_activation_fraction must be in (0, 1], "
                             f"got {self.checkpointed_activation_fraction}")


OPTIONS = (("DDP", "ddp", False), ("ZeRO-2", "zero2", False), ("ZeRO-2 + checkpointing", "zero2", True),
           ("FSDP (ZeRO-3)", "zero3", False), ("FSDP + checkpointing", "zero3", True))


def option_costs(s: Scenario) -> list[dict]:
    """Per option: bytes per rank, whether it fits, comm seconds per step, recompute seconds per step."""
    rows = []
    for label, strategy, ckpt in OPTIONS:
        acts = s.activation_bytes_per_rank * (s.checkpointed_activation_fraction if ckpt else 1.0)
        total = zero_paper_bytes(s.num_params, strategy, s.world_size) + acts
        comm_s = predicted_bytes_per_step(strategy, MIXED_PRECISION_GRAD_BYTES * s.num_params,
                                          s.world_size) / s.link_bytes_per_s
        rows.append({"option": label, "bytes_per_rank": int(total), "fits": total <= s.gpu_memory_bytes,
                     "comm_s": comm_s, "recompute_s": s.forward_s if ckpt else 0.0,
                     "extra_s": comm_s + (s.forward_s if ckpt else 0.0)})
    return rows


def advise(s: Scenario) -> dict:
    """The row of the decision table for one scenario: the choice and the numbers behind it."""
    rows = {r["option"]: r for r in option_costs(s)}
    fitting = [r for r in rows.values() if r["fits"]]
    if not fitting:
        choice = "does not fit: more ranks, tensor/pipeline parallelism or offload"
    else:
        first = fitting[0]                       # OPTIONS are in order of preference
        cheaper = [r for r in fitting if r["extra_s"] < first["extra_s"]]
        choice = min(cheaper, key=lambda r: r["extra_s"])["option"] if cheaper else first["option"]
    return {"scenario": s.name, "params_billion": s.num_params / 1e9, "gpu_memory_gb": s.gpu_memory_bytes / 1e9,
            "world_size": s.world_size, "link_gb_per_s": s.link_bytes_per_s / 1e9,
            **{f"{r['option']} GB/rank": r["bytes_per_rank"] / 1e9 for r in rows.values()},
            "DDP comm ms": rows["DDP"]["comm_s"] * 1e3, "FSDP comm ms": rows["FSDP (ZeRO-3)"]["comm_s"] * 1e3,
            "choice": choice}


def lm_scenario(lm: LMFootprint, gpu: str, gpu_memory_bytes: int, world_size: int, link_bytes_per_s: float,
                mfu: float, link_label: str = "") -> Scenario:
    """A Scenario for a counted transformer LM: its activations, checkpointed fraction and forward time."""
    label = f", {link_label} link" if link_label else ""
    return Scenario(f"{lm.name}, {world_size}x{gpu_memory_bytes / 1e9:.0f} GB{label}", lm.num_params,
                    gpu_memory_bytes, world_size, link_bytes_per_s, lm.activation_bytes, lm.checkpointed_fraction,
                    forward_seconds(lm.forward_flops, gpu, mfu))
