"""Every parallelism composed on one mesh: one transformer trained on a 4-rank grid as dp x tp, FSDP2 x tp, dp x pp,
tp x cp and pp x tp, each equal to one process, with the bytes each axis sent (notebook 18).

model (the stack, its one-process reference, gradients put back together) < counting (bytes per axis) < ring (ring
attention over a cp group) < steps (one step per composition, on a rank) < runs (launch, check, the formulas);
train (a timed training step of any layout, Adam, ZeRO-2/3 as FSDP2: what the planner's self-score runs);
plots (the grid and the bytes, drawn); exercises (18's checked exercises).
Every group comes from :mod:`labkit.comm.mesh`.
"""

# the modules a learner uses (docs/api.md lists their names, one line each)
__all__ = ["counting", "exercises", "model", "plots", "ring", "runs", "steps", "train"]
