"""Fixtures of the node-lab tests: skip (with the reason) where no network namespace can be made."""
from __future__ import annotations

import pytest

from labkit.cluster.nodes import namespace_support


@pytest.fixture(scope="session")
def namespaces_here() -> str:
    """'root' or 'user' where emulated nodes can be built; otherwise the test is skipped with the reason."""
    mode, reason = namespace_support()
    if mode is None:
        pytest.skip(reason)
    return mode
