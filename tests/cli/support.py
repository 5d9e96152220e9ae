"""Helpers shared by the CLI tests: run `python -m labkit` as a person does, or in-process for usage errors."""
from __future__ import annotations

import os
import subprocess
import sys

from labkit.cli import main as cli

ENV = {**os.environ, "LABKIT_OFFLINE": "1", "LABKIT_MODE": "fast"}

def labkit(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run `python -m labkit ARGS` and return the finished process (text stdout/stderr)."""
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout_s)

def usage_error(argv: list[str], capsys) -> str:
    """Run the CLI in-process, expect exit status 2, and return what it printed on stderr."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:   # argparse's own errors
        code = exit_.code
    assert code == 2, f"{argv} should be a usage error (exit 2), got {code}"
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    return err

def available(name: str) -> bool:
    """True when this build of the CLI has the subcommand (its labkit pieces exist)."""
    return name in cli.build_parser()._subparsers._group_actions[0].choices
