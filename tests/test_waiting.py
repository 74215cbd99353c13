"""The shared wait helper: it returns the first answer that holds, wakes on an event where one is given, and past its
deadline fails naming what it awaited and the last answer it saw."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_for


def test_returns_the_first_truthy_answer() -> None:
    answers = iter([None, 0, "", "ready", "later"])
    assert wait_for(lambda: next(answers), "an answer", timeout_s=5, interval_s=0) == "ready"


def test_until_decides_and_the_accepted_answer_may_be_falsy() -> None:
    answers = iter([3, 2, 1, 0, -1])
    assert wait_for(lambda: next(answers), "zero", timeout_s=5, interval_s=0, until=lambda n: n == 0) == 0


def test_asks_at_least_once_even_with_no_time() -> None:
    assert wait_for(lambda: "now", "now", timeout_s=0) == "now"


def test_a_timeout_names_what_was_awaited_and_the_last_answer() -> None:
    with pytest.raises(
        AssertionError, match=r"timed out after 0.1 s waiting for the phase Running; last seen: 'Pending'"
    ):
        wait_for(lambda: "Pending", "the phase Running", timeout_s=0.1, until=lambda p: p == "Running")


def test_pause_wakes_on_the_event_instead_of_a_timer() -> None:
    changed, state, pauses = threading.Event(), {"done": False}, list[float]()

    def flip() -> None:
        state["done"] = True
        changed.set()

    def pause(left_s: float) -> None:
        assert 0 < left_s <= 30
        pauses.append(left_s)
        changed.wait(left_s)

    threading.Timer(0.05, flip).start()
    assert wait_for(lambda: state["done"], "the flip", timeout_s=30, interval_s=3600, pause=pause)
    assert pauses, "the wait slept on a timer instead of awaiting the event"
