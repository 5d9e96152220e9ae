"""The one int validator: exact messages for every kind of bad input."""
import numpy as np
import pytest

from labkit.core.validation import checked_int, positive_int


@pytest.mark.parametrize("bad, message", [
    (0, "batch_size must be an integer >= 1, got 0"),
    (-3, "batch_size must be an integer >= 1, got -3"),
    (2.0, "batch_size must be an integer >= 1, got 2.0 (float)"),
    ("8", "batch_size must be an integer >= 1, got '8' (str)"),
    (True, "batch_size must be an integer >= 1, got True (bool)"),
])
def test_positive_int_rejects_with_one_clear_line(bad, message):
    with pytest.raises(ValueError) as err:
        positive_int(bad, "batch_size")
    assert str(err.value) == message


def test_bounds_none_and_numpy_ints():
    assert positive_int(np.int64(4), "steps") == 4
    assert checked_int(None, "limit", allow_none=True) is None
    assert checked_int(0, "num_workers", minimum=0) == 0
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 1797, got 100000; "
                                         r"the dataset has 1797 samples$"):
        positive_int(100000, "world_size", maximum=1797, hint="the dataset has 1797 samples")


def test_positive_ints_returns_a_tuple_or_one_clear_line():
    from labkit.core.validation import positive_ints

    assert positive_ints([1, np.int64(8), 32], "batch_sizes") == (1, 8, 32)
    assert positive_ints(range(1, 4), "world_sizes") == (1, 2, 3)
    with pytest.raises(ValueError, match=r"^batch_sizes is empty; give integers >= 1"):
        positive_ints([], "batch_sizes")
    with pytest.raises(ValueError, match=r"^each value in world_sizes must be an integer >= 1, got 0$"):
        positive_ints([2, 0], "world_sizes")
    for bad in ("8", 8, None):
        with pytest.raises(ValueError, match=r"^batch_sizes must be a list of integers >= 1"):
            positive_ints(bad, "batch_sizes")


def test_positive_number_takes_any_real_above_zero():
    from labkit.core.validation import positive_number

    assert positive_number(0.5, "timeout_s") == 0.5 and positive_number(np.float32(2), "lr") == 2.0
    assert positive_number(3, "lr") == 3.0 and isinstance(positive_number(3, "lr"), float)
    for bad in (0, -1.0, float("nan"), "1", True, None):
        with pytest.raises(ValueError, match=r"^timeout_s must be a number > 0, got"):
            positive_number(bad, "timeout_s")
