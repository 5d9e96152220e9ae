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
    assert cases[:4] == [{"node_rank": g, "local_rank": l, "nnodes": 2, "nproc_per_node": 2}
                         for g in range(2) for l in range(2)]
    with pytest.raises(ValueError, match="node-by-node"):
        exercises.rank_env_cases_for([dict(good[3], rank=1)], 2, 2)
    assert exercises.rank_env_cases_for(None, 2, 2) == exercises._layout_cases()
