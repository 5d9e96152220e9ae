"""Run a command with one process spinning on one core for the whole run: ``make test-busy`` (issue 22).

Learners run the kit beside a browser, an IDE or Binder neighbours. This runs the kit's own checks the same way:
``python scripts/run_busy.py [--cores N] -- make test`` starts N spinning processes
(``labkit.core.contention.spinning_cores``), runs the command, and always stops them, on success, failure,
Ctrl-C or a signal; the exit status is the command's.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit.core.contention import spinning_cores  # noqa: E402  (the checkout's labkit, without installing it)


def parse(argv: list[str]) -> argparse.Namespace:
    """--cores N, then the command after '--'."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=1, help="spinning processes, one core each (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("give the command to run after --, e.g. run_busy.py -- make test")
    if args.cores < 0:
        parser.error(f"--cores must be >= 0, got {args.cores}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Spin, run, stop -> the command's exit status."""
    args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # so `finally` stops the spinners on kill too
    with spinning_cores(args.cores) as pids:
        print(f"run_busy: {args.cores} process(es) spinning (pid {', '.join(map(str, pids)) or '-'}) "
              f"while running: {' '.join(args.command)}", flush=True)
        try:
            return subprocess.run(args.command).returncode
        except KeyboardInterrupt:
            return 130
        except FileNotFoundError as err:
            print(f"run_busy: cannot run {args.command[0]!r}: {err.strerror}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
