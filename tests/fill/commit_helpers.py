"""Helpers of the split-commit tests: a FillTask opened from a manifest, bubbles run in process, a writer whose file
part waits for the test."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipefill.spec import load_file
from pipefill_fill.commits import CommitWriter
from pipefill_fill.inbubble import BubbleOutcome, run_steps
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.store import ProgressStore, Staged
from pipefill_fill.task import FillTask, TaskSpec

CPU = torch.device("cpu")
PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "commitEverySamples": 8}


@dataclass(frozen=True)
class Bubble:
    id: int
    open_ns: int
    expected_end_ns: int
    kind: str = "steady"


def open_task(manifest: Path) -> FillTask:
    torch.set_num_threads(1)
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job, base_dir=manifest.parent))  # type: ignore[arg-type]
    task.open(device=CPU, memory_budget_bytes=1 << 30)
    return task


def bubble(task: FillTask, *, left_s: float, commit_s: float, bubble_id: int = 0) -> BubbleOutcome:
    """One bubble of ``left_s`` from now for ``task``; its commits' device part is predicted to take ``commit_s``."""
    now = time.monotonic_ns()
    return run_bubble(task, Bubble(bubble_id, now, now + int(left_s * 1e9)), commit_s=commit_s)


def run_bubble(task: FillTask, b: Bubble, *, commit_s: float, model: StepModel | None = None) -> BubbleOutcome:
    """Steps of ``task`` in ``b`` until its expected end (``model``: by default, a profile of 0.1 ms a sample)."""
    return run_steps(
        b,
        task=task,
        max_batch=8,
        model=model or StepModel({1: 1e-4, 8: 1e-3}),
        commit_estimate=Estimator(default_s=commit_s),
        is_open=lambda _id: True,
        deadline_ns=b.expected_end_ns,
        device=CPU,
    )


class HeldWriter(CommitWriter):
    """A commit writer whose file part waits until ``release`` is set (a disk that does not answer), at most
    ``limit_s``; ``started`` is set when the first file part is waiting."""

    def __init__(self, *, limit_s: float = 10.0) -> None:
        self.release, self.started = threading.Event(), threading.Event()
        super().__init__(write=self._held)
        self.limit_s = limit_s

    def _held(self, store: ProgressStore, staged: Staged) -> int:
        self.started.set()
        self.release.wait(self.limit_s)
        return store.write(staged)
