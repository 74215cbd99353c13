"""Helpers of the split-commit tests: a FillTask opened from a manifest, bubbles run in process, a writer whose file
part waits for the test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from pipefill.events import EventWriter
from pipefill.plan import ProfilePoint
from pipefill.spec import load_file
from pipefill_fill.commits import CommitWriter
from pipefill_fill.dispatch import Dispatcher
from pipefill_fill.inbubble import BubbleOutcome, run_steps
from pipefill_fill.jobs import Jobs
from pipefill_fill.metrics import FillMetrics
from pipefill_fill.overruns import Margin
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.settings import Settings
from pipefill_fill.sources import WorkSource
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


def run_bubble(
    task: FillTask,
    b: Bubble,
    *,
    commit_s: float,
    model: StepModel | None = None,
    is_open: Callable[[int], bool] = lambda _id: True,
) -> BubbleOutcome:
    """Steps of ``task`` in ``b`` until its expected end (``model``: by default, a profile of 0.1 ms a sample), while
    ``is_open`` says the trainer has not closed it."""
    return run_steps(
        b,
        task=task,
        max_batch=8,
        model=model or StepModel({1: 1e-4, 8: 1e-3}),
        commit_estimate=Estimator(default_s=commit_s),
        is_open=is_open,
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


def stub_dispatcher(tmp_path: Path, tasks: dict[str, FillTask], *, guard_s: float = 0.0) -> Dispatcher:
    """The executor's dispatcher over ``tasks`` as active, profiled jobs (steps of 0.125 ms a sample, batch 8)."""

    def active(task: FillTask) -> SimpleNamespace:
        profile = SimpleNamespace(points=[ProfilePoint(8, 1e-3, 0)])
        return SimpleNamespace(
            task=task, profile=profile, profile_taken=True, profiler=profile, piece_costs=lambda: None,
            model=StepModel({8: 1e-3}),
            commit_estimate=Estimator(default_s=0.0), margin=Margin(), any_batch_size=True, offloader=None,
            transfer_estimate=Estimator(default_s=0.0), spec=SimpleNamespace(priority=0, kind="inference"),
        )  # fmt: skip

    jobs = SimpleNamespace(active={n: active(t) for n, t in tasks.items()}, generation=1, step_clock=None)
    return dispatcher(tmp_path, jobs, guard_s=guard_s)  # type: ignore[arg-type]


def dispatcher(tmp_path: Path, jobs: Jobs, *, guard_s: float = 0.0) -> Dispatcher:
    """The executor's dispatcher over ``jobs`` on the CPU: every bubble open, no announcement floor, no switch cost."""
    settings = Settings(
        channel_dir=tmp_path, work_source="", training_job="t", rank=0, reserved_bytes=1 << 30, min_bubble_s=0.0,
        guard_s=guard_s, device="cpu", cpu_affinity=None, metrics_port=0, out_dir=None, offload=False,
    )  # fmt: skip
    return Dispatcher(
        jobs=jobs,
        is_open=lambda _id: True,
        recent_bubbles=list,
        device=CPU,
        settings=settings,
        switch=Estimator(default_s=0.0),
        events=EventWriter(None),
    )


def cpu_jobs(source: WorkSource, events: EventWriter, **kwargs: Any) -> Jobs:
    """The executor's jobs over ``source`` on the CPU, settings from the environment, metrics in a registry of their
    own; ``kwargs``: the other arguments of :class:`Jobs`."""
    registry = kwargs.pop("registry", None) or CollectorRegistry()
    return Jobs(
        source=source, device=CPU, settings=Settings.from_env(), metrics=FillMetrics(registry), events=events, **kwargs
    )
