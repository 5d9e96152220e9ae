"""Answers compared type and shape first, then value: whole numbers exactly, floats to a tolerance."""
import math

import pytest

from labkit.core.answers import mismatch, plain, show, show_args


@pytest.mark.parametrize("got, want, why", [
    ("16640625000", 16640625000, "a str, not a number"),
    (True, 1, "a bool, not a number"),
    (16640625001, 16640625000, ""),
    (16640625000 * (1 + 1e-9), 16640625000, "not a whole number"),
    (math.nan, 0.5, "NaN"),
    ([1, 2, 3], (1, 2), "3 items, not 2"),
    ({"a": 1}, {"b": 1}, "keys"),
    (1, True, "an int, not a bool"),
    (0.5 * (1 + 1e-3), 0.5, ""),
    ({"a": "1"}, {"a": 1}, "a: a str"),
])
def test_a_mismatch_says_why(got, want, why):
    reason = mismatch(got, want, 1e-6)
    assert reason is not None and why in reason


@pytest.mark.parametrize("got, want", [(16640625000, 16640625000), (16640625000.0, 16640625000),
                                       (0.5 * (1 + 1e-8), 0.5), ([1, 2.0], (1, 2.0)), (math.nan, math.nan),
                                       ({"a": (1, 2)}, {"a": [1, 2]}), (None, None), ("x", "x"), (False, False)])
def test_matches(got, want):
    assert mismatch(got, want, 1e-6) is None


def test_plain_converts_arrays_and_show_is_short_and_safe():
    np = pytest.importorskip("numpy")
    assert plain((np.int64(3), np.array([1.5, 2.0]))) == (3, [1.5, 2.0]) and type(plain(np.int64(3))) is int

    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")

    assert show(Hostile()) == "<Hostile object>" and "bits" in show(10 ** 20_000)
    assert show(list(range(100))).endswith("(100 items)]") and show_args({"x": 0.1234567}) == "x=0.123457"
