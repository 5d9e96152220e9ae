"""Is a simulated all-reduce right? Within the rounding its summation order allows, and identical on every rank.

Two separate checks, because they teach two different things:

* **Close to the exact sum, within a derived bound.** Floating-point addition rounds, so a reduction that adds
  the R workers' values in a different order gets a (slightly) different answer. If every input passes through
  at most ``d`` roundings on its way to the result, the computed sum obeys
  ``|s_hat - s| <= gamma_d * sum_i |x_i|`` with ``gamma_d = d u / (1 - d u)`` and ``u`` the unit roundoff
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002, section 4.2 and Lemma 3.1;
  Higham 1993, "The accuracy of floating point summation", SIAM J. Sci. Comput. 14(4)). Summing one term after
  another (naive, ring) gives ``d = R - 1``; a balanced tree (tree, recursive halving) ``d = ceil(log2 R)``.
  An algorithm this module does not know gets ``R - 1``, which bounds every summation order of R terms.
* **Bitwise identical on every rank.** Whatever the rounding, all ranks must hold the same bits, or data-parallel
  replicas drift apart step by step. This is checked exactly, apart from the bound.

Integer sums and max/min are exact: their bound is zero.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# roundings on one input's path to the result, by algorithm (world_size R -> depth)
_DEPTH = {"naive": lambda r: r - 1, "ring": lambda r: r - 1,
          "tree": lambda r: math.ceil(math.log2(r)) if r > 1 else 0,
          "halving_doubling": lambda r: math.ceil(math.log2(r)) if r > 1 else 0}


class AllreduceMismatch(RuntimeError):
    """A simulated all-reduce broke its error bound, or two ranks disagree; the message says which and by how much."""


def summation_depth(algorithm: str, world_size: int) -> int:
    """Additions on the longest path from one worker's value to the result (R - 1 when the algorithm is unknown)."""
    return _DEPTH.get(algorithm, lambda r: r - 1)(world_size)


def unit_roundoff(dtype: np.dtype | str) -> float:
    """u = 2**-p for a p-bit significand (float16 2**-11, float32 2**-24, float64 2**-53); 0 for integers."""
    dt = np.dtype(dtype)
    return 0.0 if np.issubdtype(dt, np.integer) else float(np.finfo(dt).eps) / 2


def error_bound(arrays: Sequence[np.ndarray], algorithm: str, op: str) -> np.ndarray:
    """Per-element bound on |computed - exact| (Higham 2002, section 4.2): gamma_d * sum |x_i|, 0 when exact."""
    data = np.stack([np.asarray(a, dtype=np.float64).ravel() for a in arrays])     # (world_size, n)
    u = unit_roundoff(np.asarray(arrays[0]).dtype)
    if u == 0.0 or op in ("max", "min"):
        return np.zeros(data.shape[1])
    depth = summation_depth(algorithm, len(arrays)) + (1 if op == "mean" else 0)   # mean: one more rounding
    gamma = depth * u / (1 - depth * u)
    scale = np.abs(data).sum(axis=0) / (len(arrays) if op == "mean" else 1)
    tiny = float(np.finfo(np.asarray(arrays[0]).dtype).smallest_subnormal)        # underflow, once per rounding
    return gamma * scale + depth * tiny


def exact_allreduce(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction in float64 (exact for the simulator's sizes of half and single precision), flattened."""
    data = np.stack([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
    return {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op](data, axis=0)


def check_allreduce(arrays: Sequence[np.ndarray], outputs: Sequence[np.ndarray], algorithm: str, op: str) -> dict:
    """Check both properties; returns the largest error and its bound, or raises AllreduceMismatch."""
    first = np.ascontiguousarray(outputs[0]).tobytes()
    differ = [rank for rank, out in enumerate(outputs) if np.ascontiguousarray(out).tobytes() != first]
    if differ:
        raise AllreduceMismatch(f"{algorithm}: ranks {differ[:8]} hold different bits from rank 0; every rank must "
                                "end with the identical result, or the replicas drift apart")
    exact, bound = exact_allreduce(arrays, op), error_bound(arrays, algorithm, op)
    error = np.abs(np.asarray(outputs[0], dtype=np.float64).ravel() - exact)
    worst = int(np.argmax(error - bound)) if error.size else 0
    if error.size and error[worst] > bound[worst]:
        raise AllreduceMismatch(f"{algorithm}: element {worst} differs from the exact {op} by {error[worst]:g}, "
                                f"more than the rounding bound {bound[worst]:g} (depth "
                                f"{summation_depth(algorithm, len(arrays))}, Higham 2002 section 4.2)")
    return {"max_abs_error": float(error.max()) if error.size else 0.0,
            "max_error_bound": float(bound.max()) if bound.size else 0.0, "ranks_identical": True}
