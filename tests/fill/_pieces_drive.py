"""Test helper: run one FillJob without bubbles, in pieces or in whole steps, so a test can SIGKILL it with a batch in
flight (issue #25, partial steps).

usage: python _pieces_drive.py MANIFEST BATCH_SIZE MODE
MODE ``whole``: whole steps, the workload's own ``step`` (the reference); ``pieces``: every batch piece by piece, a
commit after each; ``inflight:N``: as ``pieces``, and after N batches of this life start one, run all but its last piece,
commit (the batch in flight is not part of it), print ``INFLIGHT committed progress`` and wait to be killed.
Prints ``READY committed`` after recovery and ``DONE`` at the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from pipefill.spec import load_file
from pipefill_fill.task import FillTask, TaskSpec


def main() -> int:
    manifest, batch_size, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job, base_dir=Path.cwd()))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    task.use_pieces = mode != "whole"
    print("READY", task.committed, flush=True)
    stop_after = int(mode.split(":")[1]) if mode.startswith("inflight:") else -1
    batches = 0
    while not task.finished and not task.done():
        if batches == stop_after:
            task.step_piece(batch_size)
            while (flight := task.in_flight()) is not None and flight.done < flight.pieces - 1:
                task.step_piece(batch_size)  # all but its last piece
            assert task.in_flight() is not None, "the batch completed in one piece"
            task.commit()
            print("INFLIGHT", task.committed, task.progress, flush=True)
            time.sleep(3600)
        if task.pieces is None:
            task.step(batch_size)
        else:
            while task.step_piece(batch_size) == 0 and task.in_flight() is not None:
                pass
        batches += 1
        task.commit()
    task.finish()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
