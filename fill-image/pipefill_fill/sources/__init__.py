"""Work sources: ``files:<dir>`` (shared by file locks, or following a queue: queued.py) and ``kubernetes`` (see
base.py); :func:`open_source` picks one from the env value."""

from __future__ import annotations

from pathlib import Path

from pipefill import env
from pipefill_fill.sources.base import Identity, ProgressReport, WorkSource

__all__ = ["Identity", "ProgressReport", "WorkSource", "open_source"]


def open_source(value: str, *, identity: Identity) -> WorkSource:
    """The work source named by ``PIPEFILL_WORK_SOURCE`` (``files:<dir>`` or ``kubernetes``)."""
    if value.startswith("files:") and len(value) > len("files:"):
        from pipefill_fill.sources.files import FilesSource
        from pipefill_fill.sources.queued import QUEUE_MARKER, QueuedFilesSource

        directory = Path(value[len("files:") :])
        if (directory / QUEUE_MARKER).is_file():  # pipefill local's queue writes the assignments
            return QueuedFilesSource(directory, identity=identity)
        return FilesSource(directory, identity=identity)
    if value == "kubernetes":
        from pipefill_fill.sources.kubernetes import KubernetesSource  # imports the client only here

        return KubernetesSource(identity=identity)
    raise ValueError(f"{env.WORK_SOURCE}={value!r}: expected files:<dir> or kubernetes")
