"""Entry point for `python -m labkit`."""
import sys

try:
    from labkit.cli.main import main
except KeyboardInterrupt:      # Ctrl-C while Python is still importing the kit: no traceback
    sys.stderr.write("interrupted\n")
    sys.exit(130)

sys.exit(main())
