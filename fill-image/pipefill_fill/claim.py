"""Claiming a slice of a job: which one (the job's output directory says which are unfinished), from whom (the work
source decides who may hold what), then opening it (recovering its store); a slice found finished is given back and
the next one tried."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from pipefill.events import EventWriter, SliceEvent
from pipefill_fill import collect
from pipefill_fill.locks import LockBusy
from pipefill_fill.profilecache import device_key, workload_key
from pipefill_fill.slices import JobDir
from pipefill_fill.sources import WorkSource
from pipefill_fill.store import Superseded
from pipefill_fill.task import FillTask
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["MAX_BUILT", "RECOVERY_LOCK_TIMEOUT_S", "built_key", "claim_slice"]

log = logging.getLogger("pipefill_fill")

MAX_BUILT = 2
"""Workloads whose last instance an executor keeps for the next slice or job of the same workload to reuse: the
jobs it holds at once by default (``PIPEFILL_FILL_MAX_ACTIVE_JOBS``); each kept instance holds its model's memory."""

RECOVERY_LOCK_TIMEOUT_S = 10.0
"""How long opening a slice waits for its commit lock: a previous owner's commit in flight takes well under that; a
previous owner that hangs holding it (a lost node whose process lives on) would hold up every job of this executor."""


def claim_slice(
    source: WorkSource,
    spec: TaskSpec,
    job: JobDir,
    *,
    device: torch.device,
    memory_budget_bytes: int,
    events: EventWriter,
    lock_timeout_s: float = RECOVERY_LOCK_TIMEOUT_S,
    built: dict[str, object] | None = None,
) -> FillTask | None:
    """Claim and open an unfinished slice of ``job``; None when there is none for this executor now.

    Started slices come first (:meth:`JobDir.open_slices`), so a crashed executor's slice is resumed before fresh work
    begins. The task's store is fenced by the assignment's epoch and the source's check that it is current
    (:class:`pipefill_fill.store.Superseded`); a slice that moved before it was opened is given back, not failed.
    A slice whose commit lock another process holds past ``lock_timeout_s`` is given back and
    :class:`pipefill_fill.locks.LockBusy` raised: the job waits, the executor's other jobs go on. When every slice
    is done but the job is not complete (its last finisher died before the outputs), the job is completed here,
    without a claim (nothing is left to assign). A slice found done on opening (its owner finished it
    since the directory was read) is given back and the next one tried. Raises what opening raised (the job fails).
    ``built``: the executor's last workload instance per workload and device (:func:`built_key`), offered to the
    new slice's workload to reuse (``FillTask.open``); the new one replaces it.
    """
    for _ in range(len(job.plan()) + 1):
        candidates = job.open_slices()
        if not candidates:
            if not job.done():
                FillTask(spec, job.plan()[-1]).complete_job(device=device, memory_budget_bytes=memory_budget_bytes)
            return None
        s = source.claim(spec, candidates)
        if s is None:
            return None
        try:
            epoch = source.epoch(spec.name, s)
            task = FillTask(spec, s, epoch=epoch, guard=_guard(source, spec.name, s, epoch))
            key = built_key(task, device)
            previous = built.get(key) if built is not None else None
            recovered = task.open(
                device=device,
                memory_budget_bytes=memory_budget_bytes,
                lock_timeout_s=lock_timeout_s,
                previous=previous,
            )
            if built is None:
                collect.instance_dropped()  # none is kept: the last slice's went with it
            else:
                built.pop(key, None)
                built[key] = task.workload
                while len(built) > MAX_BUILT:  # the oldest workload's instance goes (its memory with it)
                    built.pop(next(iter(built)))
                    collect.instance_dropped()
        except Superseded as exc:  # it moved between the poll and the opening: not this executor's any more
            log.info("%s; given back", exc)
            source.release(spec.name, s)
            events.write(SliceEvent(job=spec.name, start=s.start, end=s.end, phase="superseded", position=s.start))
            continue
        except LockBusy:  # its previous owner hangs inside a commit: not now
            source.release(spec.name, s)
            events.write(SliceEvent(job=spec.name, start=s.start, end=s.end, phase="busy", position=s.start))
            raise
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


def built_key(task: FillTask, device: torch.device) -> str:
    """What makes two slices' workloads interchangeable: the same code and parameters on the same device."""
    return f"{workload_key(task)}|{device_key(device)}"


def _guard(source: WorkSource, name: str, s: Slice, epoch: int) -> Callable[[], str | None]:
    """The store's check at every commit: is this executor's assignment of ``s`` at ``epoch`` still current?"""
    return lambda: source.revoked(name, s, epoch)
