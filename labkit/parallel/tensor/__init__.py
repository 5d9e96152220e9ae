"""Tensor and sequence parallelism, inside the layer (notebook 13).

megatron (the f and g operators, column- and row-parallel linears, sequence parallelism, by hand) < dtensor (the same
with torch's parallelize_module) < runs (on real ranks) < report, compare (against DP and ZeRO-3); cost (the formulas);
exercises (13's checked exercises, and fg_pair: the f/g pair written by the learner, judged on live ranks); figures
(the MLP's split and the 2 x 2 mesh, drawn).
"""

# the modules a learner uses (docs/api.md lists their names, one line each)
__all__ = ["compare", "cost", "dtensor", "exercises", "figures", "megatron", "report", "runs"]
