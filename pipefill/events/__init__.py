"""The event log: typed records with one writer and one reader, used by both images, the report, the live view and
the benchmarks (format: ``docs/events.md``)."""

from pipefill.events import records
from pipefill.events.log import FILL_EVENTS, TRAINER_EVENTS, EventTail, EventWriter, parse_event, read_events
from pipefill.events.records import *  # noqa: F403  # every record type, named once in records.__all__

__all__ = ["FILL_EVENTS", "TRAINER_EVENTS", "EventTail", "EventWriter", "parse_event", "read_events"]
__all__ += records.__all__
