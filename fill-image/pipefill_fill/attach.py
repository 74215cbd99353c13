"""Attach to the bubble channel as its consumer and adapt it to what the runner needs (:class:`runner.Link`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pipefill.channel import Bubble, ChannelNotFoundError, Consumer
from pipefill.plan import ObservedBubble

__all__ = ["ChannelLink", "attach"]

log = logging.getLogger("pipefill_fill")


class ChannelLink:
    """The runner's view of the channel: the consumer's calls plus the ring of measured bubbles as planner input."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def wait_bubble(self, timeout_s: float) -> Bubble | None:
        return self.consumer.wait_bubble(timeout_s)

    def is_open(self, bubble_id: int) -> bool:
        return self.consumer.is_open(bubble_id)

    def acknowledge(self, bubble_id: int, *, used_s: float, overrun_s: float, work: int) -> None:
        self.consumer.acknowledge(bubble_id, used_s=used_s, overrun_s=overrun_s, work=work)

    def trainer_alive(self) -> bool:
        return self.consumer.trainer_alive()

    def hold_requested(self) -> bool:
        return self.consumer.hold_requested()

    def close_of(self, bubble: Bubble) -> int:
        return self.consumer.close_of(bubble)

    def recent_bubbles(self) -> list[ObservedBubble]:
        """Closed bubbles of the ring, each as long as the fill could plan for: its measured length, but no longer
        than the trainer announced (the planner plans up to the announced end; a bubble measured longer mostly held
        the fill's own overrun, which on a shared core delays the trainer's close)."""
        return [
            ObservedBubble(min(r.actual_s, r.predicted_s), r.free_bytes, str(r.kind))
            for r in self.consumer.history()
            if r.actual_ns > 0
        ]

    def publish_floor(self, floor_s: float) -> None:
        self.consumer.publish_floor(floor_s)

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return self.consumer.info().gpu_uuids

    @property
    def job_name(self) -> str:
        return self.consumer.info().job_name

    def close(self) -> None:
        self.consumer.close()


def attach(channel_dir: Path, *, timeout_s: float | None = None, log_every_s: float = 60.0) -> ChannelLink:
    """Wait for the trainer's channel (the fill executor starts first, as a native sidecar) and attach to it.

    ``timeout_s``: give up after this long (None: wait until stopped), raising ChannelNotFoundError.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        slice_s = log_every_s if deadline is None else max(0.0, min(log_every_s, deadline - time.monotonic()))
        try:
            return ChannelLink(Consumer.attach(channel_dir=channel_dir, timeout_s=slice_s))
        except ChannelNotFoundError as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            log.info("waiting for the trainer's channel: %s", exc)
