"""Batch-size rules of thumb that need no framework: the learning rate for a batch, each replica's share.

Torch-free, so TensorFlow-only children and the launcher use the same rules as the PyTorch lessons.
"""
from __future__ import annotations


def scaled_lr(base_lr: float, batch_size: int, base_batch: int = 32, rule: str = "linear") -> float:
    """Learning rate for ``batch_size`` from one tuned at ``base_batch``: 'linear' (Goyal et al. 2017,
    section 2.1: lr * batch / base_batch), 'sqrt' or 'none'. A starting point to tune from, not a law."""
    ratio = batch_size / base_batch
    rules = {"linear": ratio, "sqrt": ratio ** 0.5, "none": 1.0}
    if rule not in rules or base_lr <= 0 or base_batch < 1 or batch_size < 1:
        raise ValueError(f"need rule in {tuple(rules)}, base_lr > 0 and batch sizes >= 1; got {rule!r}, "
                         f"{base_lr}, {batch_size}, {base_batch}")
    return base_lr * rules[rule]


def per_replica_batch(global_batch: int, replicas: int, min_per_replica: int = 16) -> int:
    """Per-GPU batch for data parallelism; ValueError unless global % replicas == 0 and the share >= minimum."""
    from labkit.core.data import validate_batch_size

    global_batch = validate_batch_size(global_batch, name="global_batch")
    replicas = validate_batch_size(replicas, name="replicas")
    if global_batch % replicas:
        raise ValueError(f"global_batch={global_batch} is not a multiple of replicas={replicas}; use e.g. "
                         f"{replicas * max(1, global_batch // replicas)} so every replica gets the same batch")
    share = global_batch // replicas
    if share < min_per_replica:
        raise ValueError(f"global_batch={global_batch} over {replicas} replicas gives {share} per GPU, below "
                         f"{min_per_replica}: each GPU would be starved of work; use global_batch >= "
                         f"{min_per_replica * replicas}")
    return share
