"""The operator's event-loop exception handler: kopf's watch streams that do not close cleanly as the operator stops
are said at INFO (a known kopf 1.45 artefact at exit, about one SIGTERM in four with events in flight: it made
`pipefill bench operator` count errors); everything else stays asyncio's ERROR."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from pipefill_operator.__main__ import exit_noise

_CLOSING = "an error occurred during closing of asynchronous generator"


async def infinite_watch() -> AsyncIterator[int]:  # named as kopf's watch stream
    yield 1


async def some_other_stream() -> AsyncIterator[int]:
    yield 1


def test_a_watch_stream_not_closing_at_exit_is_info_and_anything_else_stays_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    athrow = RuntimeError("generator didn't stop after athrow()")
    try:
        with caplog.at_level(logging.INFO):
            exit_noise(loop, {"message": _CLOSING, "asyncgen": infinite_watch(), "exception": athrow})
            exit_noise(loop, {"message": _CLOSING, "asyncgen": some_other_stream(), "exception": athrow})
            exit_noise(loop, {"message": _CLOSING, "asyncgen": infinite_watch(), "exception": ValueError("boom")})
    finally:
        loop.close()
    said = [(r.name, r.levelname) for r in caplog.records]
    assert said == [("pipefill_operator", "INFO"), ("asyncio", "ERROR"), ("asyncio", "ERROR")], said
    assert "did not close cleanly at exit" in caplog.records[0].getMessage()
