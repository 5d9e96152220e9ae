"""Input pipelines in PyTorch: DataLoader settings and torch thread counts, measured (notebook 04).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["exercises", "loaders", "oversubscription", "threads"]
