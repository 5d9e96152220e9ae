"""ipywidgets dashboards over functions that also run without them: the batch-size dashboard (dashboard, over
batch_runs: runs as data and their fair comparisons; batch_limits: the largest batch the memory model and the
finder allow; batch_views: bars, curves and the results table), ring_view and explorer; and the figures drawn from
what a notebook ran: the course map (00), the pitfalls (09), a hang per rank (09b), the critical batch (02b).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["batch_limits", "batch_runs", "course_map", "dashboard", "explorer", "hang_view", "pitfall_views", "plan_view",
           "ring_view", "target_views"]
