"""`labkit` / `python -m labkit`: the main parser and one module per subcommand.
"""
