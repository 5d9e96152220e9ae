"""Batch-size rules of thumb that need no framework: the learning rate for a batch, each replica's share, and
whether one batch size learned more than another on a validation set of a given size.

Torch-free, so TensorFlow-only children (``labkit.tf``) and the launcher use the same rules as the PyTorch
lessons.
"""
from __future__ import annotations

import math
import warnings

from labkit.core.validation import positive_int, positive_number
from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE, STATISTICS, Verdict

LR_RULES = ("linear", "sqrt", "none")
MIN_PER_REPLICA_BATCH_GPU = 16   # rule of thumb: fewer samples per GPU leave most of it idle


def scaled_lr(base_lr: float, batch_size: int, base_batch: int = 32, rule: str = "linear") -> float:
    """Learning rate for ``batch_size`` from one tuned at ``base_batch``: 'linear' (Goyal et al. 2017,
    section 2.1: lr * batch / base_batch), 'sqrt' or 'none'. A starting point to tune from, not a law."""
    if rule not in LR_RULES:
        raise ValueError(f"rule must be one of {LR_RULES}, got {rule!r}")
    base_lr = positive_number(base_lr, "base_lr")
    ratio = positive_int(batch_size, "batch_size") / positive_int(base_batch, "base_batch")
    return base_lr * {"linear": ratio, "sqrt": ratio ** 0.5, "none": 1.0}[rule]


def per_replica_batch(global_batch: int, world_size: int, *, on_gpu: bool = False,
                      min_per_replica: int = MIN_PER_REPLICA_BATCH_GPU) -> int:
    """Each replica's share of ``global_batch`` in data parallelism (``global_batch // world_size``).

    ValueError when it does not divide evenly (replicas would get unequal batches); on a GPU, a warning
    when the share is below ``min_per_replica``: a rule of thumb, not an error, since CPU lessons train
    small batches on purpose. Scale the global batch with the replicas: per-replica batch x world_size
    (``strategy.num_replicas_in_sync`` in TensorFlow).
    """
    global_batch = positive_int(global_batch, "global_batch")
    world_size = positive_int(world_size, "world_size")
    min_per_replica = positive_int(min_per_replica, "min_per_replica")
    if global_batch % world_size:
        lower = global_batch // world_size * world_size
        near = [m for m in (lower, lower + world_size, lower + 2 * world_size) if m > 0][:2]
        raise ValueError(f"global_batch={global_batch} does not divide evenly over world_size={world_size} "
                         f"replicas (they would get unequal batches); use a multiple of {world_size}, e.g. "
                         f"{near[0]} or {near[1]} (global batch = per-replica batch x world_size)")
    share = global_batch // world_size
    if on_gpu and share < min_per_replica:
        warnings.warn(f"{share} samples per replica is too few to keep a GPU busy (rule of thumb: >= "
                      f"{min_per_replica}); raise global_batch to at least {min_per_replica * world_size} "
                      "or use a smaller world_size", stacklevel=2)
    return share


def accuracy_gap(claim: str, higher: float, lower: float, n_val: int, *, rival: str, k: float = 3.0) -> Verdict:
    """Did accuracy ``higher`` beat ``lower`` (each measured on the same ``n_val`` images) by more than ``k`` binomial
    standard errors of the difference? The rival (e.g. 'the batch makes no difference') predicts no gap; a gap
    within k standard errors cannot reject it: INCONCLUSIVE (statistics), with the images it would take. k = 3: a
    false pass under 0.2% when the two accuracies are truly equal."""
    for name, acc in (("higher", higher), ("lower", lower)):
        if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not 0.0 <= acc <= 1.0:
            raise ValueError(f"{name} must be an accuracy in [0, 1], got {acc!r}")
    n_val = positive_int(n_val, "n_val")
    # the sampling error of each accuracy on n_val images; at least half an image, so 0% and 100% are not exact
    se = max(math.sqrt((higher * (1 - higher) + lower * (1 - lower)) / n_val), 0.5 / n_val)
    gap = higher - lower
    detail = (f"{higher:.3f} vs {lower:.3f} on {n_val} images: a gap of {gap:+.3f}, {gap / se:+.1f} standard errors "
              f"(needs > {k:g})")
    if gap > k * se:
        return Verdict(claim, CHECKED, f"{detail}; rules out {rival} (a gap of 0)", rival=rival)
    if gap < -k * se:
        return Verdict(claim, FAILED, f"{detail}: the other way round", rival=rival)
    need = math.floor(n_val * (k * se / gap) ** 2) + 1 if gap > 0 else None
    more = f"about {need} validation images would settle it" if need else "no gap in the claimed direction"
    return Verdict(claim, INCONCLUSIVE, f"{detail}: within the sampling error of {n_val} images, so {rival} cannot "
                                        f"be rejected; {more}", kind=STATISTICS, rival=rival)
