"""One validator for the counts and sizes every lab takes (batch sizes, steps, workers, world sizes).

Bad input must fail at the call with one line that says what is allowed, not deep inside torch. Torch-free,
so the CLI parsers and TensorFlow-only children use it too. Messages keep one form:
``<name> must be an integer >= 1, got 0``, plus an optional hint that says what to do.
"""
from __future__ import annotations

import numbers


def checked_int(value: object, name: str, *, minimum: int = 1, maximum: int | None = None,
                allow_none: bool = False, hint: str = "") -> int | None:
    """Return ``value`` as an int in ``[minimum, maximum]`` or raise one clear ValueError.

    Rejects bools, floats (even 2.0: a float batch size is a bug upstream) and strings. ``maximum`` comes with
    a ``hint`` that names the limit's source, e.g. ``"the dataset has 1797 samples"``.
    """
    if type(value) is int and value >= minimum and (maximum is None or value <= maximum):
        return value            # the common case, first: the planner validates about a million counts a plan
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "an integer" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {kind} >= {minimum}, got {value!r} ({type(value).__name__})"
                         + (f"; {hint}" if hint else ""))
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"{name} must be an integer {allowed}, got {value}" + (f"; {hint}" if hint else ""))
    return int(value)


def positive_int(value: object, name: str, *, maximum: int | None = None, hint: str = "") -> int:
    """``checked_int`` with minimum 1: the common case (batch size, steps, world size)."""
    if type(value) is int and value >= 1 and maximum is None:
        return value
    return checked_int(value, name, minimum=1, maximum=maximum, hint=hint)  # type: ignore[return-value]


def positive_ints(values: object, name: str, *, hint: str = "") -> tuple[int, ...]:
    """A non-empty sequence of ints >= 1 (batch sizes, world sizes) as a tuple, or one clear ValueError."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a list of integers >= 1, got {values!r}" + (f"; {hint}" if hint else ""))
    items = tuple(values)  # type: ignore[arg-type]
    if not items:
        raise ValueError(f"{name} is empty; give integers >= 1, e.g. [1, 2, 4]" + (f"; {hint}" if hint else ""))
    return tuple(positive_int(v, f"each value in {name}", hint=hint) for v in items)


def positive_number(value: object, name: str, *, hint: str = "") -> float:
    """A real number > 0 (seconds, a learning rate, bytes per second) as a float, or one clear ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}" + (f"; {hint}" if hint else ""))
    return float(value)
