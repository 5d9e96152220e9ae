"""Compare a learner's answer with the reference's: plain data first, then types and shapes, then values.

:func:`plain` turns numpy/torch results into Python data (``tolist``) and leaves anything else as it is;
:func:`mismatch` says why an answer differs (a str is not a number, a bool is not an int, a float is not a whole
number of bytes, a list has the wrong length, a value is NaN) before it compares values: whole numbers exactly,
floats to a relative tolerance no tighter than :data:`FLOAT32_REL_TOL`, so the right formula computed in float32
is right. A ``Fraction``, ``Decimal`` or other real number becomes an int (when whole) or a float. Only plain
Python data is ever compared or shown: :func:`only_plain` (run in the guarded call, like :func:`plain`) puts a
:class:`Foreign` marker where the learner returned any other object, so none of its methods runs outside the
guarded call. Torch-free.
"""
from __future__ import annotations

import decimal
import fractions
import math
import numbers
from dataclasses import dataclass
from typing import Any

_ARRAY_MODULES = ("numpy", "torch")
# float32's machine epsilon (2**-23 = 1.19e-7) times a condition factor of 2**13: a float32 computation may lose up to
# 13 of its 24 bits and still be judged right. The noise scale's difference of two nearly equal norms loses about 10
# (worst 7.9e-5 relative over 2,400 cases); the closest typical mistake of any exercise is 5.7% off (samples_per_s's
# mean_after_warmup), 58 times this band: tests/core/test_exercise_tolerance.py keeps both facts.
FLOAT32_REL_TOL = 2.0 ** -23 * 2 ** 13
_PLAIN_LEAVES = (bool, int, float, str, type(None))
_SHOW_INT_BITS = 10_000         # str() of bigger ints raises (Python's int-to-str limit): show their size instead


@dataclass(frozen=True)
class Foreign:
    """Stands for an object of another type the learner returned (kept only by its type's name)."""

    type_name: str


def _real(value: Any) -> Any:
    """A Fraction, Decimal or other real number -> int when whole, else float; anything else unchanged."""
    if type(value) in _PLAIN_LEAVES or not isinstance(value, (numbers.Real, decimal.Decimal)):
        return value
    try:
        exact = fractions.Fraction(value)       # exact for Rational, float and finite Decimal
    except (TypeError, ValueError, OverflowError, ArithmeticError):   # NaN/inf Decimal, a Real that is not rational
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError, ArithmeticError):
            return value
        return number if type(number) is float else value
    whole = int(exact.numerator) if exact.denominator == 1 else None
    if whole is not None:
        return whole if type(whole) is int else value
    try:
        number = float(exact)
    except OverflowError:                        # a ratio beyond float's range: still an answer, not a crash
        number = math.inf if exact > 0 else -math.inf
    return number if type(number) is float else value


def plain(value: Any) -> Any:
    """numpy/torch scalars and arrays -> Python numbers and lists; tuples/lists/dicts converted item by item."""
    if type(value).__module__.split(".")[0] in _ARRAY_MODULES and hasattr(value, "tolist"):
        return value.tolist()
    if type(value) in (list, tuple):
        return type(value)(plain(v) for v in value)
    if type(value) is dict:
        return {k: plain(v) for k, v in value.items()}
    return _real(value)


def only_plain(value: Any) -> Any:
    """The value with every object that is not plain data (exact bool/int/float/str/None, list, tuple, dict with
    plain keys) replaced by a :class:`Foreign`, so nothing the learner made travels out of the guarded call."""
    kind = type(value)
    if kind in _PLAIN_LEAVES:
        return value
    if kind in (list, tuple):
        return kind(only_plain(v) for v in value)
    if kind is dict:
        plain_keys = all(type(k) in _PLAIN_LEAVES for k in value)
        return {k: only_plain(v) for k, v in value.items()} if plain_keys else Foreign("dict")
    return Foreign(kind.__name__)


def _kind(value: Any) -> str:
    if type(value) is Foreign:
        return f"a {value.type_name}"
    return {bool: "a bool", int: "an int", float: "a float", str: "a str", list: "a list", tuple: "a tuple",
            dict: "a dict", type(None): "None"}.get(type(value), f"a {type(value).__name__}")


def _number_mismatch(got: Any, want: Any, rel_tol: float) -> str | None:
    if type(got) is bool or type(got) not in (int, float):
        return f"{_kind(got)}, not a number"
    if type(want) is int:                           # whole numbers (bytes, ranks, counts) compare exactly
        if type(got) is float and not math.isfinite(got):
            return f"{got!r}, not a finite number"
        if type(got) is float and not got.is_integer():
            return f"{got!r} is not a whole number: count with integers (// rather than /)"
        return None if got == want else ""
    try:
        number = float(got)
    except OverflowError:                           # 10**400: no float is that large
        return f"an int of {got.bit_length()} bits, not a finite number"
    if math.isnan(number):
        return None if math.isnan(want) else "NaN, not a number"
    if math.isnan(want):
        return ""
    if math.isinf(number) and not math.isinf(want):
        return f"{number!r}, not a finite number"
    return None if math.isclose(number, want, rel_tol=rel_tol, abs_tol=1e-12) else ""


def mismatch(got: Any, want: Any, rel_tol: float) -> str | None:
    """None when ``got`` matches ``want``; else why not: a sentence for a wrong type or shape, '' for a wrong
    value. ``rel_tol`` applies to floats only (the exercise's stated tolerance)."""
    if type(want) is bool:
        return None if got is want else ("" if type(got) is bool else f"{_kind(got)}, not a bool (True/False)")
    if type(want) in (int, float):
        return _number_mismatch(got, want, rel_tol)
    if type(want) in (list, tuple):
        if type(got) not in (list, tuple):
            return f"{_kind(got)}, not a sequence of {len(want)}"
        if len(got) != len(want):
            return f"{len(got)} items, not {len(want)}"
        reasons = [mismatch(g, w, rel_tol) for g, w in zip(got, want)]
        typed = [f"item {i}: {r}" for i, r in enumerate(reasons) if r]
        return typed[0] if typed else (None if all(r is None for r in reasons) else "")
    if type(want) is dict:
        if type(got) is not dict:
            return f"{_kind(got)}, not a dict"
        if set(got) != set(want):
            return f"keys {sorted(map(str, got))}, not {sorted(map(str, want))}"
        reasons = {k: mismatch(got[k], want[k], rel_tol) for k in want}
        typed = [f"{k}: {r}" for k, r in reasons.items() if r]
        return typed[0] if typed else (None if all(r is None for r in reasons.values()) else "")
    if type(want) is str or want is None:
        if type(got) is not type(want):
            return f"{_kind(got)}, not {_kind(want)}"
        return None if got == want else ""
    return None if type(got) is type(want) and got == want else ""


def show(value: Any, width: int = 70) -> str:
    """A short, readable, safe rendering (floats to 6 digits, long values cut, foreign objects by type only)."""
    if type(value) is float:
        return f"{value:.6g}"
    if type(value) is Foreign:
        return f"<{value.type_name} object>"
    if type(value) is int and value.bit_length() > _SHOW_INT_BITS:
        return f"<an int of {value.bit_length()} bits>"
    if type(value) is dict and isinstance(value.get("traceEvents"), list):
        return f"<trace of {len(value['traceEvents'])} events>"
    if type(value) in (list, tuple) and len(value) > 8:
        return f"[{', '.join(show(v) for v in value[:8])}, ... ({len(value)} items)]"
    if type(value) in (list, tuple):
        inner = ", ".join(show(v) for v in value)
        text = f"[{inner}]" if type(value) is list else f"({inner}{',' if len(value) == 1 else ''})"
    elif type(value) is dict:
        text = "{" + ", ".join(f"{show(k)}: {show(v)}" for k, v in list(value.items())[:8]) + "}"
    elif type(value) in (bool, int, str, type(None)):
        text = repr(value)
    else:
        return f"<{type(value).__name__} object>"
    return text if len(text) <= width else text[:width - 5] + " ...]"


def show_args(case: dict) -> str:
    """``name=value, ...`` for one case."""
    return ", ".join(f"{k}={show(v)}" for k, v in case.items())
