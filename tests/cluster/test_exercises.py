"""The checked exercises of labkit.cluster.exercises: references pass, typical mistakes get their hints."""
import pytest

from labkit.core.exercises import Exercise
from labkit.cluster import exercises
from tests.exercise_support import assert_sound

EXERCISES = [v for v in vars(exercises).values() if isinstance(v, Exercise)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.key for e in EXERCISES])
def test_exercise_is_sound(exercise):
    assert_sound(exercise)


def test_launch_places_become_cases_and_a_wrong_place_is_refused():
    good = [{"rank": g * 2 + l, "group_rank": g, "local_rank": l, "world_size": 4, "local_world_size": 2}
            for g in range(2) for l in range(2)]
    cases = exercises.rank_env_cases_for(good, 2, 2)
    assert cases[:4] == [{"group_rank": g, "local_rank": l, "nnodes": 2, "nproc_per_node": 2}
                         for g in range(2) for l in range(2)]
    with pytest.raises(ValueError, match="node-by-node"):
        exercises.rank_env_cases_for([dict(good[3], rank=1)], 2, 2)
    assert exercises.rank_env_cases_for(None, 2, 2) == exercises._layout_cases()


def test_group_ranks_follow_the_rendezvous_order_of_addresses_not_the_node_rank_flag():
    """c10d sorts the nodes' descriptors (address as a string): 10.77.0.10 comes before 10.77.0.2."""
    assert exercises.rendezvous_group_ranks(["10.77.0.2", "10.77.0.10", "10.77.0.1"]) == {
        "10.77.0.1": 0, "10.77.0.10": 1, "10.77.0.2": 2}
    placed = [{"rank": g, "group_rank": g, "local_rank": 0, "world_size": 2, "local_world_size": 1,
               "node_addr": addr} for g, addr in enumerate(["10.77.0.1", "10.77.0.2"])]
    assert len(exercises.rank_env_cases_for(placed, 2, 1)) == 2 + len(exercises._layout_cases())
    swapped = [dict(placed[0], node_addr="10.77.0.2"), dict(placed[1], node_addr="10.77.0.1")]
    with pytest.raises(ValueError, match="rendezvous' order"):
        exercises.rank_env_cases_for(swapped, 2, 1)
    out = ["W1127 ... run.py:973] node_rank is only used for static rdzv_backend. It will be ignored for "
           "rdzv_backend=c10d.\nrank 1 ok", ""]
    assert exercises.node_rank_ignored(out) == [out[0].splitlines()[0]]
