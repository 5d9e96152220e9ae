"""Signals during start-up: held until the block ends, whichever thread the kernel gave them to; one line, 130/143."""
import os
import signal

import pytest

from labkit.core.interrupts import exit_for_signal, signals_deferred, started_as_command


def test_a_signal_taken_by_another_thread_still_waits_for_the_deferred_block():
    """The start-up probe's crash: a library thread that does not block SIGINT takes it (pthread_kill forces the
    kernel's choice here); the block still finishes, and the interrupt comes after it."""
    import threading

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    finished = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_deferred():
                signal.pthread_kill(worker.ident, signal.SIGINT)
                for _ in range(2_000_000):          # Python would run a raising handler in here
                    pass
                finished.append(True)
            for _ in range(2_000_000):
                pass
    finally:
        stop.set()
    assert finished == [True] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_deferred_signal_can_end_the_command_with_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        with signals_deferred(exit_for_signal):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1_000_000):
                pass
    assert stop.value.code == 143 and capsys.readouterr().err == "terminated (SIGTERM)\n"


def test_a_deferral_outside_the_main_thread_holds_nothing_and_fails_nothing():
    import threading

    done = []

    def body() -> None:
        with signals_deferred():
            done.append(True)

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert done == [True]


def test_the_command_is_told_from_a_notebook_by_the_interpreter_arguments(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "orig_argv", ["python", "-X", "utf8", "-m", "labkit", "sweep"])
    assert started_as_command()
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python", "/venv/bin/labkit", "doctor"])
    assert started_as_command()
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "ipykernel_launcher", "-f", "k.json"])
    assert not started_as_command()
