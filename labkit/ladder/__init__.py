"""The tuning ladder: one job made faster rung by rung, each rung measured (notebook 10).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["climb", "config", "exercises", "to_target"]
