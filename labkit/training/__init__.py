"""The instrumented training loop and what it measures: step phases, utilisation, FLOPs and MFU, the memory model
and its checks, the hardware ceiling, batch-size finder and sweep, mixed precision (notebooks 01 and 02).
"""
