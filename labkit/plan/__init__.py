"""Which parallelism? The planner (notebook 14): shapes (GQA, SwiGLU and mixture-of-experts arithmetic: parameters,
FLOPs, activations) < specs (model, device, cluster, layout; memory per rank by term)
< planner (step time by term, every feasible layout ranked, why the winner wins) < runnable (the measured machine,
the ranking within what runs here, the picks) < score (the top layouts run on
real ranks, predicted against measured) and published (the memory formula against a paper's figures);
exercises (notebook 14's)."""

__all__ = ["exercises", "planner", "published", "score", "score_runs", "shapes", "specs"]
