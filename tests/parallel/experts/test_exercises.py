"""Notebook 15's exercises: each reference is right on a hand-worked case and each planted mistake is caught."""
import pytest

from labkit.core.exercises import Exercise
from labkit.parallel.experts import exercises as epx
from tests.exercise_support import assert_sound


def test_kept_per_expert_caps_at_the_rounded_up_capacity():
    # capacity = ceil(1.25 x 10 x 2 / 4) = ceil(6.25) = 7
    assert epx.kept_per_expert_reference([9, 5, 3, 3], 10, 2, 1.25) == [7, 5, 3, 3]
    assert epx.kept_cases_for([9, 5, 3, 3], 10, 2, 1.25)[0]["routed"] == [9, 5, 3, 3]


def test_a2a_bytes_counts_both_directions_twice_without_the_own_block():
    # rank 1 sends 4 + 6 rows away in dispatch, returns 2 + 3 in combine: 15 rows x 8 h x 2 B x 2 (backward)
    assert epx.a2a_bytes_reference(1, [4, 9, 6], [2, 7, 3], 8, 2) == 15 * 16 * 2


EXERCISES = [v for v in vars(epx).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_slow_link_bytes_worked_by_hand():
    # EP over a pair across 2 nodes, 2 ranks per node: 2 x 4 x 1024 tokens x k=1 x 1/2 x 64 x 4 B = 1 MiB
    assert epx.slow_link_bytes_reference("ep", 2, 2, 2, 1024, 1, 64, 4) == 2 ** 20
    # TP over the same pair: every token's rows cross once per collective: degree/k = 2x EP's
    assert epx.slow_link_bytes_reference("tp", 2, 2, 2, 1024, 1, 64, 4) == 2 ** 21
    # a group inside one node (nodes_spanned = 1) sends nothing over the link
    assert epx.slow_link_bytes_reference("ep", 2, 1, 2, 1024, 2, 64, 4) == 0
    assert epx.slow_link_cases_for("ep", 2, 2, 2, 1024, 1, 64)[0]["tokens"] == 1024


def test_every_fresh_draw_of_slow_link_cases_tells_each_mistake_apart():
    for seed in range(20):
        cases = epx._slow_link_cases(seed)
        want = [epx.slow_link_bytes_reference(**c) for c in cases]
        for mistake in epx.SLOW_LINK.mistakes:
            assert [mistake.answer(**c) for c in cases] != want, (seed, mistake.name)
