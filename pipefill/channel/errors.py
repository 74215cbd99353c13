"""Errors of the bubble channel. Each message names the file or field, the value found, the rule and the fix."""

from __future__ import annotations

__all__ = [
    "ChannelBusyError",
    "ChannelError",
    "ChannelLayoutError",
    "ChannelNotFoundError",
    "ChannelVersionError",
]


class ChannelError(Exception):
    """Base class of every bubble channel error."""


class ChannelLayoutError(ChannelError):
    """The channel file is not a PipeFill channel: wrong magic, truncated, or inconsistent sizes."""


class ChannelVersionError(ChannelLayoutError):
    """The channel file has another layout version than this code reads and writes."""

    def __init__(self, path: str, *, expected: int, found: int) -> None:
        self.path, self.expected, self.found = path, expected, found
        super().__init__(
            f"channel file {path} has layout version {found}, this code reads version {expected}: "
            "run fill and trainer images of the same PipeFill release"
        )


class ChannelBusyError(ChannelError):
    """Another live trainer (or fill executor) already owns this channel directory."""


class ChannelNotFoundError(ChannelError, TimeoutError):
    """The channel directory or file did not appear (or no live trainer owned it) within the timeout."""
