"""The deadlines' thread (fast lane): calls in the order of their deadlines, cancelled ones never
made. tests/evaluator/test_isolation.py checks the kill it makes while the event loop stalls."""

from __future__ import annotations

import threading
import time

import pytest

from evaluator.deadlines import _Deadlines

#: Seconds a test waits for a call it expects: far beyond any deadline it sets, so that a loaded
#: host only makes the test slower.
WAIT = 30.0


def test_calls_are_made_in_the_order_of_their_deadlines() -> None:
    deadlines, made, last = _Deadlines(), [], threading.Event()

    def third() -> None:
        made.append("c")
        last.set()

    deadlines.call_later(0.3, third)
    deadlines.call_later(0.1, lambda: made.append("a"))
    deadlines.call_later(0.2, lambda: made.append("b"))
    assert last.wait(WAIT)
    assert made == ["a", "b", "c"]


def test_a_cancelled_call_is_never_made_and_lets_go_of_its_callback() -> None:
    deadlines, made, after = _Deadlines(), [], threading.Event()
    cancelled = deadlines.call_later(0.05, lambda: made.append("cancelled"))
    cancelled.cancel()
    deadlines.call_later(0.1, after.set)
    assert after.wait(WAIT)
    assert made == [] and cancelled.callback is None


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

    deadlines.call_later(0.05, fail)
    deadlines.call_later(0.1, after.set)
    assert after.wait(WAIT)
    assert "a call at a deadline failed" in caplog.text
