"""Context parallelism, along the sequence (notebook 14).

ring_attention (the block maths, the zig-zag split) < ring_runs (K/V blocks around a real ring) < ring_report;
torch_cp (torch's context_parallel on GPUs, against the ring).
"""

# the modules a learner uses (docs/api.md lists their names, one line each)
__all__ = ["ring_attention", "ring_report", "ring_runs", "torch_cp"]
