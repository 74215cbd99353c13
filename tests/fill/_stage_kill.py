"""Test helper: a slice whose last commit did not fit its bubble, made in the next one; killed by the test between
the commit's device part and its file part.

usage: python _stage_kill.py MANIFEST
Prints COMMITTED <end> (a commit written in full), DEFERRED (the slice is done, its last commit fit no bubble yet),
STAGED <end> (the device part of that commit is made; its file part waits on a disk that never answers), then waits
to be killed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from commit_helpers import HeldWriter, bubble, open_task


def main() -> int:
    task = open_task(Path(sys.argv[1]))
    task.writer = HeldWriter(limit_s=3600)
    task.step(8)
    task.step(8)
    task.commit()  # both parts, written
    print("COMMITTED", task.committed, flush=True)
    out = bubble(task, left_s=60.0, commit_s=3600.0)  # every step fits; the last commit does not
    if not (task.done() and out.stop == "done" and not out.commits_ns and task.inflight is None):
        print("NOT DEFERRED", out, flush=True)
        return 1
    print("DEFERRED", flush=True)
    out = bubble(task, left_s=60.0, commit_s=0.0)  # the next bubble: made at its start
    if not (out.commits_ns and not out.steps and task.inflight is not None):
        print("NOT STAGED", out, flush=True)
        return 1
    print("STAGED", task.inflight.staged.end, flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
