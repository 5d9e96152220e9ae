"""ipywidgets dashboards over functions that also run without them.
"""
