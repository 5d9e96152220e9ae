"""`labkit SUBCOMMAND`: the lab's measurements from the terminal.

Each subcommand calls the same `labkit` functions as the notebooks; usage errors exit with 2.
Run `labkit SUBCOMMAND --help` for a subcommand's options and examples. `labkit` is the console command
the install puts in the venv (`.venv/bin/labkit`, or plain `labkit` once the venv is activated);
`python -m labkit` is the same program.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import signal
import sys
from typing import Sequence

from labkit.core.interrupts import SIGNAL_WORDS, signals_deferred
from labkit.core.results import StoppedEarly, Terminated, WriteError, describe_os_error, sigterm_as_interrupt

# Subcommands that live in their own modules; each has `add_parser(subparsers)`.
SUBCOMMAND_MODULES = ("labkit.cli.doctor", "labkit.cli.sweep", "labkit.cli.profile", "labkit.cli.memory",
                      "labkit.cli.bench", "labkit.cli.simulate", "labkit.cli.ladder", "labkit.cli.launch",
                      "labkit.cli.roofline", "labkit.cli.diagnose", "labkit.cli.plan")
EXAMPLES = """examples (`.venv/bin/labkit` without an activated venv; `python -m labkit` is the same program):
  labkit doctor
  labkit sweep --model small_cnn --batch-sizes 16,32,64
  labkit profile --batch-size 64 --active 3
  labkit roofline --model transformer --top 15
  labkit allreduce-bench --world-size 2 --sizes 1K,64K,1M
  labkit simulate --algorithm ring --world-size 4 --size 1M
  labkit ladder --budget-epochs 1 --skip compile ddp
  labkit launch --world-size 2 labkit.comm.demos:all_reduce_sum
  labkit diagnose --world-size 3 labkit.parallel.debug.hang_exercises:uneven_shards_loop
  labkit plan --preset 70b --nodes 4"""


def build_parser() -> argparse.ArgumentParser:
    """The `labkit` parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


FAILURE_TYPES = (("labkit.core.data", "DataUnavailableError"), ("labkit.core.envcheck", "EnvironmentProblem"),
                 ("labkit.comm.launch", "LaunchError"))


def _failure_types() -> tuple[type[BaseException], ...]:
    """Errors that mean 'the measurement could not run here' (exit 1, one line), not a bug in the kit.

    Read from the modules already loaded, never imported here: a module not loaded raised nothing, and importing
    labkit.core.data (torchvision) to test an exception took seconds after a Ctrl-C or SIGTERM."""
    loaded = [getattr(sys.modules[module], name) for module, name in FAILURE_TYPES if module in sys.modules]
    return (*loaded, PermissionError, TimeoutError, WriteError)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush cannot fail again on a closed or full stdout."""
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), sys.stdout.fileno())


# Python parameter names in library messages that have no option of the same dest, per subcommand
PARAMETER_OPTIONS = {"launch": {"timeout_s": "--timeout", "world_size": "--world-size"},
                     "allreduce-bench": {"sizes_bytes": "--sizes"}, "sweep": {"memory_budget_bytes": "--memory-budget"}}


def in_option_words(message: str, parser: argparse.ArgumentParser, command: str | None) -> str:
    """``message`` with the kit's parameter names (budget_epochs) replaced by the options a user typed."""
    sub = parser._subparsers._group_actions[0].choices.get(command) if parser._subparsers else None
    names = dict(PARAMETER_OPTIONS.get(command or "", {}))
    for action in sub._actions if sub is not None else []:
        if action.option_strings and "_" in action.dest:
            names.setdefault(action.dest, max(action.option_strings, key=len))
    for name, option in names.items():
        message = re.sub(rf"(?<![\w-]){name}(?![\w])", option, message)
    return message


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The subcommand, with expected failures turned into one line (in the options' words) and an exit status."""
    def say(err: object) -> None:
        print(in_option_words(str(err), parser, args.command), file=sys.stderr)

    try:
        return args.func(args)
    except ValueError as err:  # bad arguments that argparse could not see: one line, exit 2
        say(f"error: {err}")
        return 2
    except _failure_types() as err:
        say(f"error: {err}")
        return 1
    except StoppedEarly as err:     # the finished part is already printed and saved
        say(err)
        return err.code


def _flush_or_report() -> None:
    """Flush stdout; a full or closed one becomes one line on stderr and exit status 1."""
    try:
        sys.stdout.flush()
    except OSError as err:
        _silence_stdout()
        if not isinstance(err, BrokenPipeError):
            print(f"error: {describe_os_error('standard output', err)}", file=sys.stderr)
        raise SystemExit(141 if isinstance(err, BrokenPipeError) else 1) from None


def _printable_anywhere() -> None:
    """A terminal that is not UTF-8 (C locale, PYTHONIOENCODING=latin-1) shows '?' for what it cannot encode,
    rather than failing a report half-printed with a UnicodeEncodeError (a ValueError: it would read as exit 2)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if reconfigure is not None and encoding not in ("utf8", "utf8sig"):   # the C locale: surrogateescape fails too
            reconfigure(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, check the environment, run the subcommand; a full or closed stdout is one line, never a traceback."""
    _printable_anywhere()
    try:
        with sigterm_as_interrupt():         # also while the parser is built, before any subcommand runs
            return _main(argv)
    except Terminated:
        print(SIGNAL_WORDS[signal.SIGTERM], file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(SIGNAL_WORDS[signal.SIGINT], file=sys.stderr)
        return 130


def _start(argv: Sequence[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace] | int:
    """Parse and check the environment, then import torch: the parser and arguments, or an exit status."""
    from labkit.core.envcheck import EnvironmentProblem, check_environment

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
    except SystemExit:          # --help or a usage error: argparse ignores a failed write, so check it here
        _flush_or_report()
        raise
    try:
        if args.command != "doctor":    # the doctor lists these problems among its findings instead
            check_environment(command=args.command)
    except EnvironmentProblem as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.command != "simulate":      # every other subcommand imports torch
        importlib.import_module("torch")
    return parser, args


def _main(argv: Sequence[str] | None) -> int:
    """The body of :func:`main`, inside its interrupt handling."""
    with signals_deferred():    # start-up (numpy, torch imports): an interrupt waits until it is done, then ends it
        started = _start(argv)
    if isinstance(started, int):
        return started
    parser, args = started
    try:
        code = _run(args, parser)
        sys.stdout.flush()
    except BrokenPipeError:      # `labkit ... | head -1`: the reader left; stop quietly, as a killed writer would
        _silence_stdout()
        return 141
    except OSError as err:       # `labkit ... > /dev/full`: the output was lost, so the work was not delivered
        _silence_stdout()
        if err.errno not in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS, errno.EBADF):
            raise
        print(f"error: {describe_os_error(err.filename or 'standard output', err)}", file=sys.stderr)
        return 1
    return code
