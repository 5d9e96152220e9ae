"""Tests for labkit.profile.schedule: the step arithmetic matches torch's schedule, bad values are refused."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerAction

from labkit.profile.schedule import ProfileSchedule


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(0, 3), st.integers(1, 4), st.integers(1, 3), st.integers(0, 3))
def test_schedule_matches_torch(wait, warmup, active, repeat, skip_first):
    sched = ProfileSchedule(wait, warmup, active, repeat, skip_first)
    fn = sched.to_torch()
    recorded = [i for i in range(sched.steps_needed + 5)
                if fn(i) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)]
    saves = [i for i in range(sched.steps_needed + 5) if fn(i) == ProfilerAction.RECORD_AND_SAVE]
    assert recorded == sched.active_step_numbers()
    assert len(recorded) == sched.profiled_steps == active * repeat
    assert len(saves) == repeat and saves[-1] == sched.steps_needed - 1


def test_schedule_numbers():
    sched = ProfileSchedule(wait=1, warmup=2, active=3, repeat=2)
    assert sched.steps_needed == 12 and sched.profiled_steps == 6
    assert sched.active_step_numbers() == [3, 4, 5, 9, 10, 11]


@pytest.mark.parametrize("kwargs, match", [
    ({"wait": -1}, "wait must be an integer >= 0"),
    ({"active": 0}, "active must be an integer >= 1"),
    ({"repeat": 0}, "repeat must be an integer >= 1"),
    ({"warmup": 1.5}, "warmup must be an integer"),
    ({"wait": True}, "wait must be an integer"),
])
def test_schedule_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProfileSchedule(**kwargs)
