"""`labkit` (= `python -m labkit`): the top-level parser, every subcommand's help, shared argument types, a torch-free --help.

Each subcommand's own tests live in tests/cli/test_<subcommand>.py and run it as a person runs it: subprocesses,
small sizes, output and exit codes checked.

Argument-validation edge cases also run in-process through `labkit.cli.main.main` (same parser, no torch start-up
per case); every subcommand has at least one real subprocess run and one subprocess usage error (exit 2).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from labkit.cli import main as cli
from labkit.core.clock import now_s

from tests.cli.support import available, labkit


def test_help_lists_subcommands_with_examples():
    proc = labkit("--help")
    assert proc.returncode == 0
    for name in ("doctor", "profile", "simulate", "memory"):
        assert name in proc.stdout
    assert proc.stdout.startswith("usage: labkit [-h] COMMAND ...\n")  # the console command's name, not python -m
    assert "examples (`.venv/bin/labkit` without an activated venv; `python -m labkit` is the same program):\n" \
           "  labkit doctor\n" in proc.stdout
    assert "python -m labkit " not in proc.stdout.replace("`python -m labkit` is the same program", "")


def test_the_console_command_is_the_same_program():
    """`.venv/bin/labkit` (pyproject's [project.scripts]) runs labkit.cli.main:main, as `python -m labkit` does."""
    import os
    from pathlib import Path

    from tests.cli.support import ENV

    console = Path(sys.executable).parent / "labkit"
    if not console.exists():
        pytest.skip(f"no console command next to {sys.executable} (labkit not installed into this environment)")
    proc = subprocess.run([str(console), "sweep", "--batch-sizes", "16 32"], capture_output=True, text=True,
                          env={**ENV, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == ("labkit sweep: error: argument --batch-sizes: give the numbers separated "
                                            "by commas, e.g. 16,32; got '16 32'")


def test_no_subcommand_and_unknown_subcommand_are_usage_errors(capsys):
    proc = labkit("frobnicate")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    assert cli.main([]) == 2 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["doctor", "sweep", "profile", "allreduce-bench", "simulate", "ladder"])
def test_every_subcommand_help_has_examples(name, capsys):
    if not available(name):
        pytest.skip(f"`{name}` is not in this build of the CLI (its labkit module is missing)")
    with pytest.raises(SystemExit) as exit_:
        cli.main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"\n  labkit {name}" in out and "python -m labkit" not in out


def test_doctor_keeps_its_flags():
    proc = labkit("doctor", "--json", "--no-network")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["mode"] == "fast"


def test_argument_types_and_table_formatting():
    import argparse

    from labkit.cli.common import format_bytes, format_table, int_list, jsonable, parse_bytes

    assert [parse_bytes(t) for t in ("4096", "64K", "1M", "2GiB", "1.5K")] == [4096, 65536, 2**20, 2 * 2**30, 1536]
    assert int_list("16, 32,64") == [16, 32, 64]  # spaces next to the commas are fine
    for bad in ("12Q", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_bytes(bad)
    with pytest.raises(argparse.ArgumentTypeError) as fractional:   # used to become 1 byte in silence
        parse_bytes("1.5")
    assert str(fractional.value) == ("a size must be a whole number of bytes, got '1.5' = 1.5 bytes; write a whole "
                                     "number, or a unit that makes it whole (1.5K = 1536)")
    assert parse_bytes("0.5K") == 512
    with pytest.raises(argparse.ArgumentTypeError):
        int_list("8,0")
    assert [format_bytes(n) for n in (512, 1536, 2**20, None)] == ["512 B", "1.5 KiB", "1 MiB", "n/a"]
    table = format_table([{"a": 1, "b": 2.5}, {"a": 10, "b": None}], [("a", "a (n)", str), ("b", "b (s)", str)])
    assert table.splitlines()[0] == "a (n)  b (s)" and table.splitlines()[-1].split() == ["10", "None"]
    assert json.dumps(jsonable({"x": float("nan"), "y": (1, 2)})) == '{"x": null, "y": [1, 2]}'


def test_building_the_parser_loads_neither_torch_nor_tensorflow():
    """`labkit --help` imports every subcommand module to build the parser: none may load a framework."""
    code = ("import sys; from labkit.cli.main import build_parser; build_parser(); "
            "heavy = [m for m in ('torch', 'tensorflow') if m in sys.modules]; assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_full_stdout_is_one_line_and_exit_1():
    """`labkit ... > /dev/full`: the output was lost, so the work was not delivered: exit 1, no traceback."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "labkit", "simulate", "--world-size", "2", "--size", "1K"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr == "error: cannot write standard output: the disk is full (ENOSPC)\n"


def test_a_closed_stdout_stops_quietly_with_sigpipe_status():
    """`labkit ... | head -1`: the reader left; a quiet exit 141 (128 + SIGPIPE), no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "simulate", "--world-size", "64", "--size", "4K",
                             "--show-steps", "5000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and first.startswith(b"Simulated all-reduce") and err == ""


@pytest.mark.parametrize("argv", [["simulate"], ["allreduce-bench"], ["sweep"], ["launch", "x:y"]])
def test_every_subcommand_refuses_a_bad_environment_value_alike(argv, capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_MODE", "turbo")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith("error: LABKIT_MODE must be one of ('fast', 'full')")


@pytest.mark.parametrize("sig, delay_s", [(signal.SIGINT, 0.1), (signal.SIGTERM, 0.5), (signal.SIGINT, 1.0),
                                          (signal.SIGTERM, 2.0)])
def test_an_interrupt_at_any_moment_of_start_up_is_one_line(sig, delay_s, tmp_path):
    """The probe: Ctrl-C or SIGTERM while `sweep` loads the kit, numpy and torch: exit 130/143, one line, no
    traceback, no segfault (before, a thread that did not block the signal let it interrupt torch's import).
    The delay counts from the end of Python's own start-up (as long as `python -c pass` takes now: on a busy
    machine 0.1 s after exec is still inside `site`, where Python's defaults apply)."""
    env = {**os.environ, "LABKIT_OFFLINE": "1", "LABKIT_RUN_DIR": str(tmp_path)}
    started_s = now_s()
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
    python_start_s = now_s() - started_s       # the interpreter and site, before the kit's first line: Python's
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "sweep", "--batch-sizes", "16", "--steps", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(python_start_s + delay_s)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (128 + sig, "interrupted\n" if sig == signal.SIGINT
                                      else "terminated (SIGTERM)\n"), err[-3000:]


@pytest.mark.parametrize("terminal, encoding", [({"PYTHONIOENCODING": "latin-1"}, b"iso8859-1"),
                                                ({"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}, b"ascii")])
def test_a_terminal_that_is_not_utf8_still_gets_the_report(terminal, encoding):
    """PYTHONIOENCODING=latin-1 or the C locale without UTF-8 mode: what it cannot show prints as '?', never a
    codec error read as a usage error (exit 2)."""
    env = {**{k: v for k, v in os.environ.items() if k != "LANG"}, "LABKIT_OFFLINE": "1", **terminal}
    proc = subprocess.run([sys.executable, "-m", "labkit", "doctor", "--no-network"], capture_output=True,
                          env=env, timeout=120)
    assert proc.returncode in (0, 1) and b"Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert b"Terminal     " + encoding in proc.stdout and b"not UTF-8" in proc.stdout


def test_telling_a_failure_from_a_bug_imports_nothing():
    """After a Ctrl-C or SIGTERM the CLI matches the exception against its failure types: that used to import
    labkit.core.data (and torchvision with it), seconds before the command could end."""
    code = ("import sys; from labkit.cli.main import _failure_types; types = _failure_types(); "
            "print('labkit.core.data' in sys.modules, 'torchvision' in sys.modules, len(types))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["False", "False"]
    from labkit.core.data import DataUnavailableError

    assert DataUnavailableError in cli._failure_types()      # once loaded (it could have raised), it is matched
