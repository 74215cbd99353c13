"""Slices: a job's units of work ``[0, total)`` divided into ranges that fill executors claim one at a time.

The plan is the job's plan of record (:func:`pipefill.queue.plan_slices`, written once into ``status.slices`` by the
operator, or by the files source in local runs; :attr:`TaskSpec.plan`): executors never plan. Each slice has its own exactly-once store (:mod:`pipefill_fill.store`);
the job is done when every slice is, and then its outputs are assembled once. Layout of a job's output directory::

    slices.json              {"job", "total", "bounds": [0, b1, …, total], "done"}: the plan of record (FillJob
                             status.slices) as the first executor to open the job found it; a later plan of record
                             that differs is refused (PlanMismatch), the directory untouched. "done" is set after
                             the job's outputs.npy and the workload's finalize, so it means the job is complete
    slices/<start>-<end>/    the store of each slice of a split job (chunks/, checkpoints/, progress.json)
    chunks/, checkpoints/, progress.json    the store of the only slice of a job that is not split
    outputs.npy              every slice's outputs in sample order (inference), byte-identical to a single-rank run

A directory written before slices existed (progress.json, no slices.json) is read as one slice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipefill_fill.atomic import atomic_create, atomic_write, atomic_write_bytes
from pipefill_fill.locks import locked
from pipefill_fill.store import read_pointer, slice_rows
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["JobDir", "PlanMismatch", "SliceState"]


class PlanMismatch(ValueError):
    """The plan of record (FillJob ``status.slices``) is not the one the job's output directory was started with."""

    def __init__(self, spec: TaskSpec, *, stored: list[int], planned: list[int], where: Path) -> None:
        self.stored, self.planned = stored, planned
        super().__init__(
            f"FillJob {spec.name}: status.slices plans bounds {_short(planned)} but {where} records "
            f"{_short(stored)} (its slice stores hold work counted against those); the output directory was left "
            "untouched. Give the job a new spec.output.path (or delete the old outputs) to start it again"
        )


def _short(bounds: list[int]) -> str:
    return (
        str(bounds) if len(bounds) <= 6 else f"[{bounds[0]}, {bounds[1]}, …, {bounds[-1]}] ({len(bounds) - 1} slices)"
    )


@dataclass(frozen=True)
class SliceState:
    """A slice's commit pointer as its store records it: work committed up to ``committed``; ``done``: all of it."""

    slice: Slice
    committed: int
    done: bool

    @property
    def units(self) -> int:
        return self.committed - self.slice.start


class JobDir:
    """A job's output directory across its slices: the plan, each slice's store directory and commit pointer, the
    job's committed total, and the assembly of the job's outputs once every slice is done."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.dir = spec.output_dir
        self._plan: list[Slice] | None = None

    def plan(self) -> list[Slice]:
        """The job's slices: the plan of record (``spec.plan``, from the FillJob status), checked against the layout
        its output directory already has. The first executor to open the job records the plan there
        (``slices.json``); a later plan that differs is refused with :class:`PlanMismatch`, and nothing in the
        directory is touched: its slice stores hold work counted against those bounds."""
        if self._plan is not None:
            return self._plan
        plan = self.spec.slices
        bounds = [s.start for s in plan] + [self.spec.total]
        record = self._record()
        if not record:
            # a directory written before slices existed (progress.json, no slices.json) holds one slice
            legacy = (self.dir / "progress.json").exists()
            stored = [0, self.spec.total] if legacy else bounds
            if stored == bounds:
                done = legacy and read_pointer(self.dir, start=0)[1]
                fresh = {"job": self.spec.name, "total": self.spec.total, "bounds": bounds, "done": done}
                atomic_create(self.dir / "slices.json", _dump(fresh))
                record = self._record()  # the winner's, when another executor recorded it first
            else:
                record = {"bounds": stored}
        stored = [int(b) for b in record["bounds"]]
        if stored != bounds:
            raise PlanMismatch(self.spec, stored=stored, planned=bounds, where=self.dir / "slices.json")
        self._plan = plan
        return self._plan

    def slice_dir(self, s: Slice) -> Path:
        """Where the store of slice ``s`` lives: the output directory itself when the job is not split."""
        return self.dir if len(self.plan()) == 1 else self.dir / "slices" / s.key

    def states(self) -> list[SliceState]:
        """Every slice's commit pointer, read from its progress.json (what its owner last committed). A slice whose
        pointer reached its end is done, marked or not: its owner may have died (or lost its assignment) between its
        last commit and the mark, and no one else will be given a finished slice."""
        out = []
        for s in self.plan():
            committed, done = read_pointer(self.slice_dir(s), start=s.start)
            done = done or committed >= s.end
            # a slice marked done has all of its work committed, whatever its record still says (a finished slice's
            # record may hold only the mark): its pointer is its end, or a job of one slice reports 0 when it succeeds
            out.append(SliceState(s, s.end if done else committed, done))
        return out

    def committed(self) -> int:
        """Units of work committed over all slices: the job's progress (never decreases)."""
        return sum(st.units for st in self.states())

    def open_slices(self) -> list[Slice]:
        """Slices not done, in the order to claim them: started ones first (a crashed executor's slice is resumed
        before fresh work is begun), then by position."""
        states = [st for st in self.states() if not st.done]
        return [st.slice for st in sorted(states, key=lambda st: (st.units == 0, st.slice.start))]

    def done(self) -> bool:
        """Whether the job is complete (outputs assembled, finalize run)."""
        return bool(self._record().get("done", False))

    def complete(self, finalize: Callable[[], object] | None = None) -> bool:
        """When every slice is done: write ``outputs.npy`` (inference), call ``finalize``, record the job done; under
        an exclusive lock, so it happens once however many executors finish slices at the same time. Returns whether
        the job is complete. Each step is atomic and idempotent: after a crash in between, the next call redoes it."""
        if self.done():
            return True
        with locked(self.dir / ".complete.lock"):
            record = self._record()
            if record.get("done"):
                return True
            states = self.states()
            if not all(st.done for st in states):
                return False
            if self.spec.kind == "inference":
                rows = self._assemble(states)
                atomic_write(self.dir / "outputs.npy", lambda f: np.save(f, rows, allow_pickle=False))
            if finalize is not None:
                finalize()
            atomic_write_bytes(self.dir / "slices.json", _dump({**record, "done": True}))
        return True

    def _assemble(self, states: list[SliceState]) -> np.ndarray:
        parts = [
            rows
            for st in states
            for rows in slice_rows(self.slice_dir(st.slice), start=st.slice.start, end=st.committed)
        ]
        if not parts:
            return np.empty(0, dtype=[("sample_id", "<i8"), ("value", "<f4")])
        return np.concatenate(parts)

    def _record(self) -> dict[str, Any]:
        try:
            record: dict[str, Any] = json.loads((self.dir / "slices.json").read_text())
        except FileNotFoundError:
            return {}
        return record


def _dump(record: dict[str, Any]) -> bytes:
    return (json.dumps({**record, "updated_unix_s": round(time.time(), 3)}) + "\n").encode()
