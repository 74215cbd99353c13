"""Test helper: run one FillJob to completion without bubbles, committing often, so a test can SIGKILL it anywhere.

usage: python _drive.py MANIFEST BATCH_SIZE COMMIT_EVERY_STEPS [MODE]
Prints READY (and the committed position) after recovery and DONE at the end. MODE (partial steps, issue #25):
``whole``: the workload's own whole ``step`` (the reference); ``pieces``: every batch piece by piece; ``inflight:N``:
as ``pieces``, and after N batches of this life start one, run all but its last piece, commit (the batch in flight is
not part of it), print ``INFLIGHT committed progress`` and wait to be killed. Without MODE: the executor's steps.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from pipefill.spec import load_file
from pipefill_fill.task import FillTask, TaskSpec


def _in_flight_then_wait(task: FillTask, batch_size: int) -> None:
    task.step_piece(batch_size)
    while (flight := task.in_flight()) is not None and flight.done < flight.pieces - 1:
        task.step_piece(batch_size)  # all but its last piece
    assert task.in_flight() is not None, "the batch completed in one piece"
    task.commit()
    print("INFLIGHT", task.committed, task.progress, flush=True)
    time.sleep(3600)


def main() -> int:
    manifest, batch_size, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    torch.set_num_threads(1)
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job, base_dir=Path.cwd()))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    task.use_pieces = mode != "whole"
    print("READY", task.committed, flush=True)
    stop_after = int(mode.split(":")[1]) if mode.startswith("inflight:") else -1
    steps = 0
    while not task.finished and not task.done():
        if steps == stop_after:
            _in_flight_then_wait(task, batch_size)
        if mode and task.pieces is not None:
            while task.step_piece(batch_size) == 0 and task.in_flight() is not None:
                pass
        else:
            task.step(batch_size)
        steps += 1
        if steps % every == 0 and task.commit_due(min_interval_s=0.0):
            task.commit()
    task.finish()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
