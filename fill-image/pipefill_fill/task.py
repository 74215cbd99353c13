"""One slice of a fill job in the executor: its workload, its exactly-once store, and the commit policy between them."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipefill_fill.commits import CommitWriter, Pending
from pipefill_fill.device import device_sync
from pipefill_fill.pieces import Flight, PieceSteps, piece_steps
from pipefill_fill.slices import JobDir
from pipefill_fill.store import Committed, ProgressStore, serialized
from pipefill_fill.usercode import load_job_workload
from pipefill_fill.work import Slice, TaskSpec
from pipefill_fill.workload import WorkloadContext, WorkloadProtocol

__all__ = ["FillTask", "TaskSpec"]

log = logging.getLogger("pipefill_fill")


class FillTask:
    """Drives one slice of a job: ``open`` recovers and restores, ``step`` runs one batch, ``commit`` makes work
    durable, ``finish`` marks the slice done and completes the job when it was the last.

    In a bubble a commit is split (:mod:`pipefill_fill.commits`): ``stage_commit`` is its device part, and ``writer``
    (when set) writes its file part on its own thread; ``settle`` hands back the commit once written. Without a
    writer both parts run at once.

    ``slice``: one slice of the job's plan of record (:attr:`TaskSpec.plan`); None: the only slice of a job whose plan
    has one (a runner that does not split). ``epoch``/``guard``: the assignment this executor holds and the work
    source's check that it is still current, for the store's commit fence (:class:`pipefill_fill.store.ProgressStore`)."""

    def __init__(
        self,
        spec: TaskSpec,
        slice: Slice | None = None,
        *,
        epoch: int = 0,
        guard: Callable[[], str | None] | None = None,
    ) -> None:
        self.spec = spec
        cls = load_job_workload(spec)
        self.job = JobDir(spec)
        plan = self.job.plan()
        if slice is None and len(plan) > 1:
            raise ValueError(
                f"job {spec.name}: its plan has {len(plan)} slices (the job is split across ranks); name the slice "
                "to run, or run it with the fill executor"
            )
        self.slice = slice or plan[0]
        if self.slice not in plan:
            raise ValueError(f"job {spec.name}: {self.slice} is not one of its slices ({', '.join(map(str, plan))})")
        self.store = ProgressStore(
            self.job.slice_dir(self.slice),
            job=spec.name,
            with_outputs=spec.kind == "inference",
            start=self.slice.start,
            end=self.slice.end,
            epoch=epoch,
            guard=guard,
        )
        self.context = WorkloadContext(
            name=spec.name,
            parameters=spec.parameters,
            total=spec.total,
            output_dir=spec.output_dir,
            input_path=spec.input_path,
            counts_steps=spec.counts_steps,
            start=self.slice.start,
            end=self.slice.end,
            emit_fn=self._emit,
        )
        self.workload: WorkloadProtocol = cls(self.context)
        self.progress = 0  # units done, committed or not
        self.recovered: Committed | None = None
        self._profiling = False
        self._done_before = False  # the workload's done() when the profiler took its snapshot
        self._committed_at = -math.inf  # a slice's first work is committed at once: progress within its first bubbles
        self.writer: CommitWriter | None = None  # the executor's; None: commits are written at once
        self.inflight: Pending | None = None  # the commit staged and not yet settled (at most one)
        self.deferred = 0  # bubbles in a row whose start found a commit due that did not fit
        self.deferred_since_ns = 0  # the first of them (monotonic)
        self._shapes: set[int] = set()  # batch sizes stepped since the slice was opened
        self.first_call = False  # the last step was the first of its batch size
        self.reused = False  # the workload's reuse hook was given an earlier instance (open)
        self.use_pieces = True  # run the workload's partial steps where it has them (issue #25)
        self.flight_misses = 0  # fresh bubbles in a row the next piece of the batch in flight did not fit

    def open(
        self,
        *,
        device: torch.device,
        memory_budget_bytes: int,
        lock_timeout_s: float | None = None,
        previous: object | None = None,
    ) -> Committed:
        """Recover the slice's store (waiting at most ``lock_timeout_s`` for its commit lock, see
        :meth:`ProgressStore.recover`), set the workload up and restore its committed state. When the slice was done
        already, also complete the job if that was left undone (a crash after the last slice, before the outputs).
        ``previous``: the executor's last instance of the same workload on ``device``, offered to the workload's
        optional ``reuse`` hook before ``setup`` (a model built once serves the next slices and jobs)."""
        recovered = self.store.recover(lock_timeout_s=lock_timeout_s)
        reuse = getattr(self.workload, "reuse", None)
        if previous is not None and callable(reuse) and type(previous) is type(self.workload):
            reuse(previous)
            self.reused = True
        self.workload.setup(device, memory_budget_bytes)
        if recovered.state is not None:
            self.workload.restore(recovered.state)
        self.progress = recovered.end
        self.recovered = recovered
        log.info(
            "job %s: slice %s resuming at %d (adopted %d, removed %d files)%s",
            self.spec.name,
            self.slice,
            recovered.end,
            recovered.adopted,
            recovered.removed,
            " — already done" if recovered.done else "",
        )
        if recovered.done:
            self.job.complete(self._finalize)
        return recovered

    def complete_job(self, *, device: torch.device, memory_budget_bytes: int) -> bool:
        """Complete a job whose slices are all committed but whose outputs were not assembled (its last finisher died
        first): set the workload up for its ``finalize`` and assemble, without opening any slice's store. Returns
        whether the job is complete."""
        self.workload.setup(device, memory_budget_bytes)
        return self.job.complete(self._finalize)

    @property
    def committed(self) -> int:
        """The slice's commit pointer: work committed up to here (units from the job's start)."""
        return self.store.committed

    @property
    def finished(self) -> bool:
        """The slice's work is all committed."""
        return self.store.done

    def done(self) -> bool:
        """No work left in this slice. A measured step moves the workload, not the work: while the profiler measures,
        the workload's own answer is the one it gave before (a measurement reaching the slice's end once marked the
        slice done with nothing committed)."""
        if self.progress >= self.slice.end:
            return True
        return self._done_before if self._profiling else bool(self.workload.done())

    def step(self, batch_size: int) -> int:
        """One batch of at most ``batch_size`` units, never past the slice's end; returns the units done. A workload
        with partial steps runs it as its pieces back to back (after the batch in flight, which is all it does
        then)."""
        pieces = self.pieces
        if pieces is not None and (flight := pieces.in_flight()) is not None:
            self.first_call = False
            items = pieces.step_piece(flight.batch_size)
            while pieces.in_flight() is not None:
                items = pieces.step_piece(flight.batch_size)
            self.progress += items
            return items
        n = max(1, min(batch_size, self.slice.end - self.progress))
        self.first_call = n not in self._shapes
        self._shapes.add(n)
        if pieces is not None:
            items = pieces.step_piece(n)
            while pieces.in_flight() is not None:
                items = pieces.step_piece(n)
        else:
            items = int(self.workload.step(n))
        self.progress += items
        return items

    @property
    def pieces(self) -> PieceSteps | None:
        """The workload when it runs its steps in pieces (:mod:`pipefill_fill.pieces`) and the executor lets it."""
        return piece_steps(self.workload) if self.use_pieces else None

    def in_flight(self) -> Flight | None:
        """The batch in flight (begun in pieces, not completed): it holds no committed or progress units yet."""
        pieces = self.pieces
        return pieces.in_flight() if pieces is not None else None

    def step_piece(self, batch_size: int) -> int:
        """One piece: of the batch in flight, or the first of a new batch of at most ``batch_size`` units; returns the
        units the batch completed (0 before its last piece)."""
        pieces = self.pieces
        if pieces is None:
            raise RuntimeError(f"job {self.spec.name}: step_piece on a workload without partial steps")
        flight = pieces.in_flight()
        if flight is None:
            n = max(1, min(batch_size, self.slice.end - self.progress))
            self.first_call = n not in self._shapes
            self._shapes.add(n)
        else:
            n, self.first_call = flight.batch_size, False
        items = int(pieces.step_piece(n))
        self.progress += items
        return items

    def commit_due(self, *, min_interval_s: float = 1.0) -> bool:
        """Whether uncommitted work should be committed now: at the workload's cadence (``commit_every`` units: the
        checkpoint interval of training), else at most every ``min_interval_s`` (a crash redoes at most that much).
        Never while a commit is in flight: one at a time, so the file parts of a store are written in order."""
        uncommitted = self.progress - self.store.staged
        if uncommitted <= 0 or self.inflight is not None:
            return False
        if self.done():
            return True
        every = getattr(self.workload, "commit_every", None)
        if every is not None:
            return uncommitted >= int(every)
        return time.monotonic() - self._committed_at >= min_interval_s

    @property
    def durable(self) -> bool:
        """Everything done so far is written (nothing staged or in flight)."""
        return self.inflight is None and self.store.committed >= self.progress

    def stage_commit(self, clock: Callable[[], int] = time.monotonic_ns) -> Pending | None:
        """The device part of a commit of everything done so far (the workload's state to the host, outputs and state
        to bytes); its file part goes to ``writer`` (written at once without one). None when nothing is new."""
        t0 = clock()
        staged = self.store.stage(end=self.progress, state=self.workload.state())
        if staged is None:
            return None
        self._committed_at = time.monotonic()
        stage_s = (clock() - t0) / 1e9
        if self.writer is not None:
            self.inflight = self.writer.submit(self.store, staged, stage_s=stage_s)
        else:
            pending = Pending(self.store, staged, stage_s)
            pending.written = self.store.write(staged)
            pending.done.set()
            self.inflight = pending
        return self.inflight

    def settle(self, *, timeout_s: float | None = 0.0) -> Pending | None:
        """The commit in flight once written (waiting at most ``timeout_s``; None: for good), or None. Raises what
        its file part raised (:class:`pipefill_fill.store.Superseded`: the slice moved; anything else: the storage)."""
        pending = self.inflight
        if pending is None or not pending.wait(timeout_s):
            return None
        self.inflight = None
        if pending.error is not None:
            raise pending.error
        return pending

    def commit(self) -> int:
        """Commit everything done so far, both parts now (after the one in flight); returns the bytes written."""
        self.settle(timeout_s=None)
        if self.progress == self.store.staged:
            return 0
        written = self.store.commit(end=self.progress, state=self.workload.state())
        self._committed_at = time.monotonic()
        return written

    def finish(self) -> bool:
        """After the slice's last step: commit, mark the slice done and, when every slice is done, complete the job
        (outputs.npy, the workload's finalize; once). Idempotent. Returns whether the job is complete."""
        self.commit()
        if self.store.with_outputs and self.store.committed < self.slice.end:  # never a done slice with a gap
            raise RuntimeError(
                f"job {self.spec.name}: slice {self.slice} is not marked done: its samples "
                f"[{self.store.committed}, {self.slice.end}) were never committed, but its workload's done() says "
                f"True at sample {self.progress}. An inference workload works on [context.start, context.end) and is "
                "done at context.end only (docs/fill.md, the workload SDK)"
            )
        self.store.mark_done()
        return self.job.complete(self._finalize)

    def _finalize(self) -> None:
        finalize = getattr(self.workload, "finalize", None)
        if callable(finalize):
            finalize()

    def warm_up(
        self, sizes: list[int], *, device: torch.device, max_step_s: float = 1.0, timed: bool = True
    ) -> dict[int, float]:
        """The first call of each batch size in ``sizes`` (lazy initialization, first allocations, kernels chosen for
        a shape), made outside any bubble, then (``timed``) a second call, timed: from the state now, outputs dropped,
        the state restored after. Stops after a size that runs out of device memory or whose first call takes over
        ``max_step_s`` (larger ones would take longer still). Returns the sizes called → their second call's
        seconds (what a step of that size costs once warm: a hint for the profile taken in bubbles); without
        ``timed``, the first call's (a bound: sizes a profile predicts already need no hint)."""
        if self.done():
            return {}
        snapshot = self.snapshot()
        self.begin_profiling()
        warmed: dict[int, float] = {}
        try:
            for bs in sizes:
                n = max(1, min(bs, self.slice.end - self.progress))
                try:
                    first_s = self._call(n, snapshot, device)
                    warmed[n] = self._call(n, snapshot, device) if timed and first_s <= max_step_s else first_s
                except torch.OutOfMemoryError:
                    break
                self.saw_shape(n)
                if first_s > max_step_s:
                    break
        finally:
            self.end_profiling(snapshot)
        return warmed

    def _call(self, batch_size: int, snapshot: dict[str, Any], device: torch.device) -> float:
        self.workload.restore(dict(snapshot))
        t0 = time.perf_counter()
        self.workload.step(batch_size)
        device_sync(device)
        return time.perf_counter() - t0

    def dry_commit_s(self) -> float:
        """What a commit's device part costs, measured between bubbles without committing: the state to the host and
        to bytes, twice (the first pays one-off costs), the second timed. The first commit's prediction."""
        t0 = time.perf_counter()
        for _ in range(2):
            t0 = time.perf_counter()
            serialized(self.workload.state())
        return time.perf_counter() - t0

    def saw_shape(self, batch_size: int) -> None:
        """A step of ``batch_size`` ran (its first call is behind)."""
        self._shapes.add(batch_size)

    def saw(self, batch_size: int) -> bool:
        """Whether a step of ``batch_size`` ran since the slice was opened."""
        return batch_size in self._shapes

    def snapshot(self) -> dict[str, Any]:
        """The workload state now, for the profiler to go back to after measuring."""
        return dict(self.workload.state())

    def begin_profiling(self) -> None:
        self._done_before = bool(self.workload.done())
        self._profiling = True

    def end_profiling(self, snapshot: dict[str, Any]) -> None:
        self.workload.restore(snapshot)
        self._profiling = False

    def batch_sizes(self) -> list[int]:
        fn = getattr(self.workload, "batch_sizes", None)
        return list(fn()) if callable(fn) else [1, 2, 4, 8, 16, 32]

    def _emit(self, sample_ids: np.ndarray, values: np.ndarray) -> None:
        if not self._profiling:
            self.store.add(sample_ids, values)
