"""Test helper: run one FillJob to completion without bubbles, committing often, so a test can SIGKILL it anywhere.

usage: python _drive.py MANIFEST BATCH_SIZE COMMIT_EVERY_STEPS
Prints READY after recovery and DONE at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pipefill.spec import load_file
from pipefill_fill.task import FillTask, TaskSpec


def main() -> int:
    manifest, batch_size, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job, base_dir=Path.cwd()))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    print("READY", task.committed, flush=True)
    steps = 0
    while not task.finished and not task.done():
        task.step(batch_size)
        steps += 1
        if steps % every == 0 and task.commit_due(min_interval_s=0.0):
            task.commit()
    task.finish()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
