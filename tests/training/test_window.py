"""The loop's read-back window: marks become StepRecord rows in one settle per window."""
import pytest
import torch

from labkit.training.window import PendingStep, settle


def test_settle_turns_event_marks_into_gpu_timeline_phases():
    """The CUDA path with fake events: data wait = idle gap before the first mark; one settle per window."""
    class FakeEvent:
        def __init__(self, ms):
            self.ms = ms

        def elapsed_time(self, other):
            return other.ms - self.ms

    class FakeClock:
        mode, settled = "events", 0

        def settle(self, upto=None):
            self.settled += 1

        def mark(self):
            return FakeEvent(40)

        def release(self, marks):
            pass

        def elapsed_s(self, a, b):
            return a.elapsed_time(b) / 1e3

    clock = FakeClock()
    marks = tuple(FakeEvent(ms) for ms in (12, 13, 20, 34, 40))           # copy 1, fwd 7, bwd 14, opt 6 ms
    rows = settle([PendingStep(0, 0, FakeEvent(10), marks, torch.tensor(2.5), 8)], clock)
    assert clock.settled == 1
    row = rows[0]
    assert row["data_wait_s"] == pytest.approx(0.002) and row["h2d_s"] == pytest.approx(0.001)
    assert row["forward_s"] == pytest.approx(0.007) and row["backward_s"] == pytest.approx(0.014)
    assert row["optimizer_s"] == pytest.approx(0.006) and row["step_time_s"] == pytest.approx(0.030)
    assert row["loss"] == 2.5 and row["samples_per_s"] == pytest.approx(8 / 0.030)
