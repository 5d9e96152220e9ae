"""Expert parallelism: a mixture of experts split across ranks (notebook 15).

moe (the router, top-k gating, the capacity rule and the experts, in one process) < dispatch (the same layer across
ranks: two all-to-alls with uneven splits; or every expert split by columns and rows, TP on the experts) < runs (on
real ranks, checked against one process); traffic (what EP sends: the formula and the counted splits); balance (the
skewed router, the load-balancing loss, the capacity factor); straggler (a skewed router timed on real ranks: the hot
rank and the one that waits); plots (the figures); exercises (15's checked exercises). The layer placed on emulated
nodes: :mod:`labkit.cluster.ep_mesh`.
"""

# the modules a learner uses (docs/api.md lists their names, one line each)
__all__ = ["balance", "dispatch", "exercises", "moe", "plots", "runs", "straggler", "traffic"]
