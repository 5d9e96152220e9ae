"""Notebook 09b's exercises: the hang point of the uneven loop, and the live records put first."""
from __future__ import annotations

from labkit.parallel.debug.hang_exercises import hang_point_reference, records_cases_for, stuck_rank_reference


def test_hang_point_counts_ceil_steps_per_rank():
    assert hang_point_reference(10, 1, 3) == (3, (0,))          # 4, 3, 3 steps: rank 0 waits in step 3
    assert hang_point_reference(12, 2, 3) is None               # 2 steps each
    assert hang_point_reference(9, 2, 2) == (2, (0,))           # 5 vs 4 samples: 3 vs 2 steps


def test_the_live_records_come_first_and_the_reader_names_their_rank():
    live = {0: [{"seq": 1, "op": "all_reduce", "sizes": [[4]]}], 1: [], 2: [{"seq": 1, "op": "all_reduce",
                                                                                "sizes": [[4]]}]}
    cases = records_cases_for(live)
    assert cases[0] == {"records": live} and len(cases) > 1
    assert stuck_rank_reference(live) == 1
