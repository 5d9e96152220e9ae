"""Entry point for `python -m labkit`."""
import sys

from labkit.cli import main

sys.exit(main())
