"""Sharded data parallelism and memory per rank, built on labkit.memory: DDP vs ZeRO-1/2/3, bytes sent per step,
activation checkpointing, and a decision table (notebook 11).
"""
