"""The guarded call: private copies, a time limit that stops sleeps and loops, output captured and capped, the
answer's SystemExit/KeyboardInterrupt caught as its own, and the user's real Ctrl-C still interrupting."""
import signal
import threading
import time

import pytest

from labkit.core import guard
from labkit.core.guard import OUTPUT_CAP_CHARS, run_guarded


@pytest.fixture(autouse=True)
def short_grace(monkeypatch):
    monkeypatch.setattr(guard, "GRACE_S", 0.2)


def test_the_function_gets_a_private_copy_and_its_value_comes_back():
    data = {"xs": [3, 1, 2]}

    def sorts_in_place(xs):
        xs.sort()
        return xs[0]

    outcome = run_guarded(sorts_in_place, data, 1.0)
    assert outcome.ok and outcome.value == 1 and data == {"xs": [3, 1, 2]}


@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, ValueError])
def test_whatever_the_function_raises_is_caught(kind):
    def raises():
        raise kind("boom")

    outcome = run_guarded(raises, {}, 1.0)
    assert isinstance(outcome.error, kind) and not outcome.timed_out and not outcome.ok


def test_a_sleep_and_a_loop_are_stopped_within_the_limit_and_the_loop_ends():
    for fn in (lambda: time.sleep(30), lambda: [None for _ in iter(int, 1)]):
        start = time.perf_counter()
        outcome = run_guarded(fn, {}, 0.2)
        assert outcome.timed_out and outcome.error is None and time.perf_counter() - start < 1.5
    loop = run_guarded(lambda: [None for _ in iter(int, 1)], {}, 0.1)
    assert not loop.still_running                       # a pure-Python loop really stops


def test_an_answer_that_swallows_the_stop_is_reported_as_still_running():
    stop = threading.Event()

    def stubborn():
        while not stop.is_set():
            try:
                time.sleep(0.01)
            except BaseException:
                pass

    outcome = run_guarded(stubborn, {}, 0.1)
    stop.set()
    assert outcome.timed_out and outcome.still_running


def test_output_is_captured_counted_and_capped(capsys):
    def chatty():
        print("y" * 10 * OUTPUT_CAP_CHARS)
        return 1

    outcome = run_guarded(chatty, {}, 2.0)
    assert outcome.value == 1 and len(outcome.output) == OUTPUT_CAP_CHARS and outcome.output_chars > 10 * OUTPUT_CAP_CHARS
    assert capsys.readouterr().out == ""


def test_a_real_ctrl_c_interrupts_the_check():
    main = threading.get_ident()
    threading.Timer(0.2, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        run_guarded(lambda: time.sleep(3), {}, 5.0)
    assert time.perf_counter() - start < 1.5
