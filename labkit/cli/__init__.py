"""`python -m labkit` / `labkit`: the main parser and one module per subcommand.
"""
