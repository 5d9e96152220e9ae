"""`labkit` / `python -m labkit`: the main parser and one module per subcommand.
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["bench", "diagnose", "doctor", "ladder", "launch", "main", "memory", "plan", "profile", "roofline",
           "simulate", "sweep"]
