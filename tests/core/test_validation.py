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
