"""The kit's own machinery: mode and devices, the one clock, the one precision table, the one training step, data,
models (one MLP builder), fresh processes, run directories, validation, progress bars, the lesson log and the
exercise checker (notebook 00; each lesson folder keeps its own exercises).
"""
