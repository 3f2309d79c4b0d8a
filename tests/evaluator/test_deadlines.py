"""The deadlines' thread (fast lane): calls in the order of their deadlines, cancelled ones never
made nor kept. tests/evaluator/test_isolation.py checks the kill it makes while the event loop
stalls."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from evaluator.deadlines import _Deadlines

#: Seconds a test waits for a call it expects: far beyond any deadline it sets, so that a loaded
#: host only makes the test slower.
WAIT = 30.0


@contextmanager
def held(deadlines: _Deadlines) -> Iterator[None]:
    """The thread busy in a call until the block ends: nothing else is made meanwhile."""
    holding, go = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        go.wait(WAIT)

    deadlines.call_later(0, hold)
    assert holding.wait(WAIT)
    try:
        yield
    finally:
        go.set()


def test_calls_are_made_in_the_order_of_their_deadlines() -> None:
    deadlines, made, done = _Deadlines(), [], threading.Semaphore(0)

    def maker(name: str) -> Callable[[], None]:
        def make() -> None:
            made.append(name)
            done.release()

        return make

    asked = {name: deadlines.call_later(delay, maker(name)) for name, delay in
             (("c", 0.3), ("a", 0.1), ("b", 0.2))}  # fmt: skip
    for _ in asked:
        assert done.acquire(timeout=WAIT)
    assert made == sorted(asked, key=lambda name: asked[name].when)


def test_a_cancelled_call_is_never_made_nor_kept() -> None:
    deadlines, made, after = _Deadlines(), [], threading.Event()
    with held(deadlines):
        cancelled = deadlines.call_later(0, lambda: made.append("cancelled"))
        cancelled.cancel()
        deadlines.call_later(0, after.set)
    assert after.wait(WAIT)
    assert made == [] and deadlines._pending == []


def test_cancelled_calls_are_not_kept_until_their_deadlines() -> None:
    """Runs with long time limits that end at once leave no entry each for an hour."""
    deadlines = _Deadlines()
    # Held: a thread free to run would also drop the cancelled calls that come first (a busy
    # host once let it drop four between two cancellations).
    with held(deadlines):
        asked = [deadlines.call_later(3600, lambda: None) for _ in range(300)]
        for deadline in asked[:200]:
            deadline.cancel()
        # Rebuilt at the 151st (more than half of 300): 149 left, then 49 of them cancelled.
        assert len(deadlines._pending) == 149
    for deadline in asked[200:]:
        deadline.cancel()


def test_an_earlier_deadline_is_not_held_up_by_a_later_one_already_waited_for() -> None:
    """The thread waits for the first deadline (an hour away) when a nearer one comes."""
    deadlines, waiting, soon = _Deadlines(), threading.Event(), threading.Event()
    later = deadlines.call_later(3600, lambda: None)
    deadlines.call_later(0, waiting.set)
    assert waiting.wait(WAIT)
    time.sleep(0.5)  # the thread goes back to waiting for the hour (the test's premise)
    deadlines.call_later(0.05, soon.set)
    try:
        assert soon.wait(WAIT)
    finally:
        later.cancel()


def test_a_failing_call_does_not_stop_the_ones_after_it(caplog: pytest.LogCaptureFixture) -> None:
    deadlines, after = _Deadlines(), threading.Event()

    def fail() -> None:
        raise RuntimeError("boom")

    with held(deadlines):
        deadlines.call_later(0, fail)
        deadlines.call_later(0, after.set)
    assert after.wait(WAIT)
    assert "a call at a deadline failed" in caplog.text


def test_a_thread_that_died_is_started_again() -> None:
    """One that ended (an exception no handler takes), or never started, is no excuse."""
    deadlines, after = _Deadlines(), threading.Event()
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join(WAIT)
    deadlines._thread = dead
    deadlines.call_later(0, after.set)
    assert after.wait(WAIT)
    assert deadlines._thread is not dead
