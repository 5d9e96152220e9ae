"""Timing claims in tests decide through the verdict protocol (labkit.core.verdict), like the notebooks.

A failed verdict fails the test with its detail; an INCONCLUSIVE one (the machine measurably too busy to tell)
skips it with the measured reason, so ``make test-busy`` reports it instead of failing or passing in silence.
"""
from __future__ import annotations

import pytest

from labkit.core.verdict import FAILED, INCONCLUSIVE, Verdict


def decide(*verdicts: Verdict) -> None:
    """Fail on any failed verdict, then skip with every INCONCLUSIVE reason; pass when all are checked."""
    failed = [f"{v.claim}: {v.detail}" for v in verdicts if v.state == FAILED]
    assert not failed, "timing claim failed: " + " | ".join(failed)
    unsure = [f"{v.claim}: {v.detail}" for v in verdicts if v.state == INCONCLUSIVE]
    if unsure:
        pytest.skip("INCONCLUSIVE (machine too busy to tell): " + " | ".join(unsure))
