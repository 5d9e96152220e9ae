"""The instrumented training loop and what it measures: step phases, utilisation, FLOPs and MFU, a run's memory
(the model itself is labkit.memory), the hardware ceiling, batch-size finder and sweep, mixed precision (notebooks
01 and 02), and the reference kit the parallel labs hold their runs against.
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["batch_rules", "batch_size", "ceiling", "config", "critical_claims", "exercises", "finder", "flops",
           "loop", "noise_scale", "precision", "recorded_run", "reference", "run_spec", "sampling", "time_to_target",
           "to_target"]
