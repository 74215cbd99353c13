"""A slice's first calls, between bubbles: each batch size it will run is called once before its first bubble, so
that no one-off cost of a shape (allocations, the kernels chosen for it, lazy initialization) is paid inside one.

The one-off costs of a batch size are the process's, not the model instance's: sizes this executor called already for
another slice or job of the same workload on this device (``known``, kept by :class:`pipefill_fill.jobs.Jobs` per
workload) are not called again; a new instance still makes one call of its smallest size."""

from __future__ import annotations

import time

import torch

from pipefill.events import EventWriter, StartupEvent
from pipefill_fill import collect
from pipefill_fill.active import ActiveJob, tail_sizes

__all__ = ["start_slice", "warm"]


def warm(
    known: dict[int, float | None],
    a: ActiveJob,
    sizes: list[int],
    device: torch.device,
    *,
    instance: bool,
    timed: bool = True,
) -> tuple[list[int], dict[int, float]]:
    """The first calls of ``sizes`` (``FillTask.warm_up``) not in ``known`` (batch size → seconds of a warm step, or
    None where no step was timed; updated here); with ``instance`` (a new model instance) at least one call of the
    smallest size; without ``timed`` (sizes a profile predicts already) no second call, and no time learnt (a first
    call's is no warm step's). Returns the sizes called now, and every size timed warm → its warm step's seconds (the
    profiler's hints)."""
    todo = [b for b in sizes if b not in known]
    if instance and not todo and sizes:
        todo = [min(sizes)]
    called = a.task.warm_up(todo, device=device, timed=timed) if todo else {}
    for b, seconds in called.items():
        known[b] = seconds if timed else known.get(b)
    for b in sizes:
        if b in known:
            a.task.saw_shape(b)
    hints = {b: s for b in sizes if (s := known.get(b)) is not None}
    return list(called), {**hints, **called} if timed else hints  # a size the slice's end clipped is called smaller


def start_slice(
    a: ActiveJob, started_ns: int, known: dict[int, float | None], device: torch.device, events: EventWriter
) -> None:
    """A slice just opened (since ``started_ns``: claim, recovery, setup): the first call of each batch size it will
    run — its profile's, or the profiler's candidates —, its first commit's cost measured, the slice's objects frozen
    out of the cycle collector; a ``startup`` record. Raises what the workload raised."""
    opened_ns = time.monotonic_ns()
    sizes = tail_sizes(a) if a.profile is not None else a.task.batch_sizes()
    before = [b for b in sizes if b in known]
    called, warmed = warm(known, a, sizes, device, instance=True, timed=a.profile is None)  # a profile predicts them
    a.profiler.hints = warmed  # what each size costs once warm: the profile's first predictions
    if not a.commit_estimate:  # measured, not assumed: the first commit is planned into a bubble by it
        a.commit_estimate.record(a.task.dry_commit_s())
    collect.after_startup(full=not a.task.reused)  # the slice's objects live as long as it: frozen
    end_ns = time.monotonic_ns()
    s = a.slice
    events.write(
        StartupEvent(
            job=a.name,
            slice=[s.start, s.end],
            start_ns=started_ns,
            end_ns=end_ns,
            open_s=round((opened_ns - started_ns) / 1e9, 6),
            warm_s=round((end_ns - opened_ns) / 1e9, 6),
            batch_sizes=called,
            warm_before=[b for b in before if b not in called],
            reused=a.task.reused,
        )
    )
