"""labkit.core.claims: a band or a statistical agreement that admits its rival cannot pass, and says so."""
from __future__ import annotations

import pytest

from labkit.core.claims import judge_band, judge_within_errors, samples_to_reject
from labkit.core.verdict import Rival

RIVAL = Rival("W", 4.0)          # ring attention's last rank: the rival 'W times' the first rank's work at W = 4


def test_a_band_checks_its_figure_and_rejects_its_rival_or_fails():
    right = judge_band("the last rank does 2W-1 times the work", 6.98, 6.3, 7.7, rival=RIVAL, source="rounding")
    assert right.state == "checked" and right.rival == "W" and "rules out W = 4" in right.detail
    outside = judge_band("the last rank does 2W-1 times the work", 5.0, 6.3, 7.7, rival=RIVAL, source="rounding")
    assert outside.state == "failed" and "outside it" in outside.detail
    asks_only_more_than_2 = judge_band("the last rank does 2W-1 times the work", 6.98, 2.0, 100.0, rival=RIVAL,
                                       source="a loose band")
    assert asks_only_more_than_2.state == "failed" and "cannot tell" in asks_only_more_than_2.detail


@pytest.mark.parametrize("kwargs, words", [
    ({"low": 2.0, "high": 1.0}, "low <= high"),
    ({"source": " "}, "source"),
    ({"measured": float("nan")}, "measured must be a finite number"),
])
def test_a_bad_band_is_one_clear_line(kwargs, words):
    args = {"measured": 1.0, "low": 0.5, "high": 1.5, "source": "x", **kwargs}
    with pytest.raises(ValueError, match=words):
        judge_band("c", args["measured"], args["low"], args["high"], rival=RIVAL, source=args["source"])


def test_statistics_say_how_many_samples_would_reject_the_rival():
    assert samples_to_reject(100, 1.0, 3.0, 6.0) == 26       # se must halve: 4x the samples, plus one to be strict
    assert samples_to_reject(100, 1.0, 3.0, 0.0) == 0
    verdict = judge_within_errors("agree", 10.0, 11.0, 1.0, rival=Rival("twice", 20.0), samples=50)
    assert verdict.state == "checked"
    with pytest.raises(ValueError, match="samples >= 1"):
        judge_within_errors("agree", 10.0, 11.0, 1.0, rival=Rival("twice", 20.0), samples=0)


def test_a_rival_needs_a_name_and_a_number():
    with pytest.raises(ValueError, match="needs a name"):
        Rival(" ", 1.0)
    with pytest.raises(ValueError, match="finite number"):
        Rival("no overlap", float("inf"))
