"""Model vs data parallelism: split models and pipelines, synchronous SGD, when replicas pay, and the classic
multi-GPU pitfalls on the PyTorch side (notebooks 05, 07, 09).
"""
