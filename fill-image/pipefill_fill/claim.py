"""Claiming a slice of a job: which one (the job's output directory says which are unfinished), from whom (the work
source decides who may hold what), then opening it (recovering its store); a slice found finished is given back and
the next one tried."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipefill.events import EventWriter, SliceEvent
from pipefill_fill.slices import JobDir
from pipefill_fill.sources import WorkSource
from pipefill_fill.task import FillTask
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["claim_slice"]


def claim_slice(
    source: WorkSource,
    spec: TaskSpec,
    job: JobDir,
    *,
    device: torch.device,
    memory_budget_bytes: int,
    events: EventWriter,
) -> FillTask | None:
    """Claim and open an unfinished slice of ``job``; None when there is none for this executor now.

        Started slices come first (:meth:`JobDir.open_slices`), so a crashed executor's slice is resumed before fresh
        work begins. The task's store is fenced by the assignment's epoch and the source's check that it is current
    (:class:`pipefill_fill.store.Superseded` at a commit of a slice that moved). When every slice is done but the job is not complete (its last finisher crashed before the outputs),
        the last slice is claimed: opening it completes the job. A slice found done on opening (its owner finished it
        since the directory was read) is given back and the next one tried. Raises what opening raised (the job fails).
    """
    for _ in range(len(job.plan()) + 1):
        candidates = job.open_slices() or ([] if job.done() else job.plan()[-1:])
        s = source.claim(spec, candidates) if candidates else None
        if s is None:
            return None
        try:
            epoch = source.epoch(spec.name, s)
            task = FillTask(spec, s, epoch=epoch, guard=_guard(source, spec.name, s, epoch))
            recovered = task.open(device=device, memory_budget_bytes=memory_budget_bytes)
        except BaseException:
            source.release(spec.name, s)
            raise
        events.write(
            SliceEvent(
                job=spec.name,
                start=s.start,
                end=s.end,
                phase="done" if recovered.done else "claimed",
                position=recovered.end,
                adopted=recovered.adopted,
                removed=recovered.removed,
            )
        )
        if not recovered.done:
            return task
        source.release(spec.name, s)
    return None


def _guard(source: WorkSource, name: str, s: Slice, epoch: int) -> Callable[[], str | None]:
    """The store's check at every commit: is this executor's assignment of ``s`` at ``epoch`` still current?"""
    return lambda: source.revoked(name, s, epoch)
