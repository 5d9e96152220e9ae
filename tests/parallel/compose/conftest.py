"""One launch of every composition on 4 gloo ranks, shared by the folder's tests (about 15 s on 2 busy cores)."""
from __future__ import annotations

import pytest

from labkit.parallel.compose.model import StackShape, reference_step
from labkit.parallel.compose.runs import run_compositions


@pytest.fixture(scope="session")
def composed():
    """(per-rank results of every composition, the one-process reference) for the fast stack."""
    shape = StackShape.fast()
    return run_compositions(shape, timeout_s=150), reference_step(shape)
