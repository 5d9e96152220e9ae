"""Which parallelism? The planner (notebook 14): shapes (GQA, SwiGLU and mixture-of-experts arithmetic: parameters,
FLOPs, activations) and rates (a GEMM's achieved rate by its shape, the device) < specs (model, device, cluster,
layout; memory per rank by term) < compute (the busiest stage's compute time) < planner (step time by term, every
feasible layout ranked, near-ties as one top group, why the winner wins) < runnable (the measured machine, the
ranking within what runs here, the picks) < score and score_plot (the top layouts and every axis run on real ranks,
predicted against measured, per axis) and published (the memory formula against a paper's figures, published MoE
and SC21 layouts); exercises (notebook 14's)."""

__all__ = ["exercises", "figures", "formula_sheet", "planner", "published", "score", "score_plot", "score_runs", "shapes",
           "specs"]
