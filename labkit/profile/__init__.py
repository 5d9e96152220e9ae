"""Profiling: torch.profiler on a schedule, and reading its traces (notebook 03); the roofline lab: measured roofs,
every operator of a step under them, overhead and the fixes matched to their wall (notebook 03b).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["exercises", "fixes", "operators", "profiler", "regimes", "roofline", "roofs", "schedule", "summary", "timeline", "traces"]
