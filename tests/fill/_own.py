"""Test helper: one owner of a slice of a FillJob, at an epoch, committing after every step, without bubbles: the
stale owner (epoch 1) and the new one (epoch 2) of the takeover race in test_fill_takeover.py.

usage: python _own.py MANIFEST EPOCH BATCH_SIZE
Prints READY <committed> after recovery, COMMIT <end> after each commit, then DONE, or SUPERSEDED <committed> <why>
when a commit was refused (the slice was taken over), and exits 0 either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pipefill.spec import load_file
from pipefill_fill.store import Superseded
from pipefill_fill.task import FillTask, TaskSpec


def main() -> int:
    manifest, epoch, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job, base_dir=Path.cwd()), epoch=epoch)  # type: ignore[arg-type]
    # no work source (a lost node's executor that never hears of the move): only the store's fence can stop it
    try:
        task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
        print("READY", task.committed, flush=True)
        while not task.done():
            task.step(batch)
            task.commit()
            print("COMMIT", task.committed, flush=True)
        task.finish()
    except Superseded as exc:
        print("SUPERSEDED", task.committed, exc.why, flush=True)
        return 0
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
