"""Input pipelines in PyTorch: DataLoader settings and torch thread counts, measured (notebook 04).
"""
