"""Entry point for `python -m labkit`."""
import sys

from labkit.core.interrupts import exit_for_signal, signals_deferred

with signals_deferred(exit_for_signal):   # Ctrl-C or SIGTERM while the kit is still loading: one line, no traceback
    from labkit.cli.main import main

sys.exit(main())
