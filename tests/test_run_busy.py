"""scripts/run_busy.py (make test-busy): a spinning neighbour for the whole command, always stopped after."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "run_busy.py"
# Prints the pids of the spinning processes it can see, then exits 3.
SEE_SPINNERS = ("import os\n"
                "pids = [p for p in os.listdir('/proc') if p.isdigit() and "
                "b'while True: pass' in open(f'/proc/{p}/cmdline', 'rb').read()]\n"
                "print('spinners', ' '.join(pids)); raise SystemExit(3)\n")


def test_command_runs_beside_a_spinner_its_status_is_kept_and_the_spinner_stops():
    done = subprocess.run([sys.executable, str(SCRIPT), "--", sys.executable, "-c", SEE_SPINNERS],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    header = done.stdout.splitlines()[0]
    spinner = header.split("(pid ")[1].split(")")[0]
    assert spinner in done.stdout.splitlines()[-1].split()
    assert not Path(f"/proc/{spinner}/cmdline").exists() or b"while True" not in Path(
        f"/proc/{spinner}/cmdline").read_bytes()


def test_bad_use_is_one_clear_line_and_exit_2():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "give the command to run after --" in done.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), "--", "no-such-command-xyz"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "cannot run 'no-such-command-xyz'" in done.stderr
