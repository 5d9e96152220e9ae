"""Entry point for `python -m labkit`."""
import sys

from labkit.cli.main import main

sys.exit(main())
