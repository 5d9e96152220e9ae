"""Profiling: torch.profiler on a schedule, and reading its traces (notebook 03).
"""
