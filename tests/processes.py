"""Which of the tests' processes are still there, read from /proc (no process handle needed: the children of
children a test started, or of a process it killed)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["alive", "with_marker"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def with_marker(marker: bytes) -> list[int]:
    """The live processes whose environment holds the variable ``marker`` (``b"NAME=value"``, inherited by every
    child of the process it was set for)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if marker in environ.split(b"\0") and alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids
