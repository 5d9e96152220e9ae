"""Model and pipeline parallelism: a model split by layers across devices, GPipe simulated and measured, and
torch's pipeline schedules on real ranks (notebooks 05 and 05b).

schedule_sim (the one timeline type ``Span``, the bubble measured and its formulas, the replay) < model_parallel
(split by layers, memory per stage) < gpipe (the bubble simulated and measured); schedule_sim < schedule_trace
(actions timed on a rank) < schedules (torch's schedules on real ranks) < schedule_report (05b's tables);
exercises (05 and 05b's checked exercises); stage_exercise (the "write the distributed code" exercises judged on
live ranks: 05's two-stage forward with dist.send/recv, 05b's 1F1B loop with dist.isend/recv; and on_ranks, which runs
a cell's own function on them).
"""

# the modules a learner uses (docs/api.md lists their names, one line each)
__all__ = ["exercises", "gpipe", "model_parallel", "schedule_report", "schedule_sim", "schedule_trace", "schedules",
           "stage_exercise"]
