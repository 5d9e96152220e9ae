"""Input pipelines in PyTorch: DataLoader settings and thread counts, measured (notebook 04).
"""
