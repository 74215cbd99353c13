"""The event log: typed records with one writer and one reader, used by both images, the report, the live view and
the benchmarks (format: ``docs/events.md``)."""

from pipefill.events.log import FILL_EVENTS, TRAINER_EVENTS, EventTail, EventWriter, parse_event, read_events
from pipefill.events.records import (
    EVENT_TYPES,
    ActionEvent,
    AssignEvent,
    BubbleEvent,
    CommitEvent,
    Event,
    ExitEvent,
    FillEvent,
    HoldEvent,
    JobEvent,
    ProfileEvent,
    RestartEvent,
    SliceEvent,
    StartEvent,
    StartupEvent,
    StepEvent,
    WorkEvent,
)

__all__ = [
    "EVENT_TYPES",
    "FILL_EVENTS",
    "TRAINER_EVENTS",
    "ActionEvent",
    "AssignEvent",
    "BubbleEvent",
    "CommitEvent",
    "Event",
    "EventTail",
    "EventWriter",
    "ExitEvent",
    "FillEvent",
    "HoldEvent",
    "JobEvent",
    "ProfileEvent",
    "RestartEvent",
    "SliceEvent",
    "StartEvent",
    "StartupEvent",
    "StepEvent",
    "WorkEvent",
    "parse_event",
    "read_events",
]
