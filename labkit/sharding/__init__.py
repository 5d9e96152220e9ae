"""Sharded data parallelism and memory per rank, built on labkit.memory: DDP vs ZeRO-1/2/3, bytes sent per step,
activation checkpointing, and a decision table (notebook 11).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["advice", "checkpointing", "comm_volume", "exercises", "lm_footprint", "memory", "step_peak", "strategies"]
