"""The kit's own machinery: mode and devices, the one clock, the one precision table, the one training step, data,
models (one MLP builder), fresh processes, run directories, validation, progress bars, the lesson log, the verdicts and
their rivals, and the exercise checker (notebook 00; each lesson folder keeps its own exercises).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["claims", "clock", "contention", "course", "data", "device", "env", "exercises", "lessons", "machine", "models",
           "notebook_map", "procs", "progress", "rundirs", "timing", "verdict"]
