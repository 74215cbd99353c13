"""The status reporter (``pipefill_fill.sources.reporter``): reports leave the filling thread at once, pile up in
order while a send is slow, go again after a failure that may pass, and are sent before the executor exits. Real
threads; the send is a function that blocks, fails or records, as an API server would make it."""

from __future__ import annotations

import threading
import time

from pipefill.spec import FillJobPhase
from pipefill_fill.sources import ProgressReport
from pipefill_fill.sources.reporter import Reporter, Transient


def _r(committed: int) -> ProgressReport:
    return ProgressReport(FillJobPhase.RUNNING, committed, 100)


def test_a_slow_send_never_delays_submit_and_what_piles_up_goes_in_one_send_in_order() -> None:
    in_flight, gate, sent = threading.Event(), threading.Event(), []

    def send(name: str, reports: list[ProgressReport]) -> None:
        in_flight.set()
        gate.wait()
        sent.append((name, [r.committed for r in reports]))

    reporter = Reporter(send)
    try:
        reporter.submit("a", _r(1))
        assert in_flight.wait(5)  # the first report's send hangs (a server that does not answer)
        t0 = time.monotonic()
        for c in range(2, 6):
            reporter.submit("a", _r(c))
        assert time.monotonic() - t0 < 0.05
        assert not reporter.flush(0.2) and reporter.pending() == 5
        gate.set()
        assert reporter.flush(5) and reporter.pending() == 0
    finally:
        reporter.close()
    assert sent == [("a", [1]), ("a", [2, 3, 4, 5])]  # what piled up went together, in the order it came


def test_a_failure_that_may_pass_keeps_the_reports_in_front_and_they_go_once_the_server_answers() -> None:
    failures, sent = [2], []

    def send(name: str, reports: list[ProgressReport]) -> None:
        if failures[0]:
            failures[0] -= 1
            raise Transient("timed out")
        sent.append([r.committed for r in reports])

    reporter = Reporter(send)
    try:
        reporter.submit("a", _r(1))
        reporter.submit("a", _r(2))
        assert reporter.flush(5)
    finally:
        reporter.close()
    assert failures == [0] and sent in ([[1, 2]], [[1], [2]])
    assert [c for batch in sent for c in batch] == [1, 2]  # nothing lost, nothing out of order


def test_a_send_that_raises_for_good_drops_its_reports_and_the_thread_goes_on() -> None:
    sent = []

    def send(name: str, reports: list[ProgressReport]) -> None:
        if name == "bad":
            raise ValueError("a bug")
        sent.append(name)

    reporter = Reporter(send)
    try:
        reporter.submit("bad", _r(1))
        assert reporter.flush(5)
        reporter.submit("good", _r(1))
        assert reporter.flush(5)
    finally:
        reporter.close()
    assert sent == ["good"]


def test_close_sends_what_is_left_and_gives_up_after_its_timeout() -> None:
    sent = []
    reporter = Reporter(lambda name, reports: sent.append(len(reports)))
    for c in range(3):
        reporter.submit("a", _r(c))
    reporter.close(timeout_s=5)
    assert sum(sent) == 3
    hung = Reporter(lambda name, reports: time.sleep(30))
    hung.submit("a", _r(1))
    t0 = time.monotonic()
    hung.close(timeout_s=0.3)
    assert time.monotonic() - t0 < 2.0  # the executor's exit is not held by a server that does not answer
