"""Parameter fingerprints: exact, cheap, and on real ranks they find the step and rank where weights part."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from labkit.parallel.debug.drift import first_divergence, param_fingerprint, run_drift


def test_the_fingerprint_sees_one_changed_bit_and_nothing_else():
    torch.manual_seed(0)
    a = nn.Linear(5, 3)
    b = nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    assert param_fingerprint(a) == param_fingerprint(b)
    with torch.no_grad():
        flat = b.weight.view(-1)
        flat[3] = torch.nextafter(flat[3], torch.tensor(1e9))          # one ulp
    assert param_fingerprint(a) != param_fingerprint(b)


def test_first_divergence_names_the_first_step_and_the_odd_rank():
    checks = [(0, [7, 7, 7]), (2, [7, 7, 7]), (4, [8, 8, 9]), (6, [1, 2, 3])]
    assert first_divergence(checks) == (4, (2,))
    assert first_divergence([(0, [1, 2, 3])]) == (0, (1, 2))           # no majority: rank 0's group stands
    assert first_divergence(checks[:2]) is None


def test_bad_cases_are_one_clear_error():
    with pytest.raises(ValueError, match="cases"):
        run_drift(("nope",))
    with pytest.raises(ValueError):
        run_drift(world_size=1)


def test_real_ranks_find_the_nan_skip_and_keep_per_rank_seeds_in_sync():
    ev = run_drift(("per_rank_seeds", "nan_skip", "init_seed"), world_size=3, steps=8, check_every=2, bad_step=3)
    assert ev["per_rank_seeds"].found is None
    assert ev["nan_skip"].found == (4, (2,)) and ev["nan_skip"].window() == (2, 4)
    assert ev["init_seed"].found[0] == 0
