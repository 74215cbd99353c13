"""Exactly-once progress of one slice of a job: output chunks and workload state committed atomically, reconciled
after any crash.

A job's units of work ``[0, total)`` are divided into slices (:mod:`pipefill_fill.slices`); each slice ``[start, end)``
has its own store, in the job's output directory when the job is not split and in ``slices/<start>-<end>/`` when it
is. Layout of a store's directory::

    chunks/chunk-<from>-<to>.npy       outputs of samples [from, to): structured array (sample_id int64, value)
    checkpoints/state-<to>.pt          the workload's state() after work up to ``to`` (torch.save)
    progress.json                      {"start", "end", "committed", "epoch", "state_file", "done", ...}: the commit
                                       pointer, and the epoch of the assignment that wrote it
    .commit.lock                       flock held around every recovery and commit (the fence, below)

A commit has two parts. :meth:`ProgressStore.stage` (the device part, made inside a bubble) takes the workload state
to the host and serializes it and the buffered outputs to bytes; nothing is written and the pointer stays. Then
:meth:`ProgressStore.write` (the file part, on a thread of its own: :mod:`pipefill_fill.commits`) writes, each
atomically (temp + fsync + rename): first the state file, then the chunk, then progress.json. A crash between the two
parts loses only the staged bytes: the pointer is where the last written commit left it, and the work after it is
redone.
Invariant after :meth:`ProgressStore.recover`: the chunks tile ``[start, committed)`` exactly, with no gap and no
overlap, and ``state-<committed>.pt`` exists (unless committed is start). Recovery adopts work that was complete but
not yet recorded (a chunk starting at ``committed`` whose state file exists; for training, a newer complete state file)
and removes the rest (temporary files, a state file without its chunk, chunks beyond the pointer). So a sample is never
lost (its chunk is committed or it is redone from the state before it) and never written twice (a chunk is adopted or
removed, and redone outputs are byte-identical because the workload is deterministic from its state). ``done`` in
progress.json says the slice's work is all committed; the job's ``outputs.npy`` is assembled from every slice's chunks
once all are done (:meth:`pipefill_fill.slices.JobDir.complete`).

One writer at a time, even when a slice moves while its old executor still runs (a lost node, a watch that has not
told it yet): every store is opened with the ``epoch`` of the assignment its executor holds, and recovery and every
commit run under the slice's ``.commit.lock`` (an exclusive ``flock``), which checks the pointer's epoch first.
Recovery by a newer epoch (the new owner taking over) records its epoch in progress.json before anything else; a commit
or recovery that finds a newer epoch there, or whose ``guard`` (the work source: is the assignment still current?)
says no, raises :class:`Superseded` and writes nothing. A commit that got the lock first completes before the
takeover's recovery reads the directory, which then resumes from it. So each sample is committed by exactly one
owner: zero lost, zero repeated (docs/fill.md, "Guarantees").
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipefill_fill.atomic import TMP_SUFFIX, atomic_write_bytes
from pipefill_fill.locks import locked

__all__ = [
    "Committed",
    "ProgressStore",
    "Staged",
    "Superseded",
    "read_outputs",
    "read_pointer",
    "serialized",
    "slice_rows",
]


class Superseded(RuntimeError):
    """This executor may no longer write the slice: it moved (a newer epoch took its store over, or the assignment
    is gone, moved or cancelled). Nothing was written; the executor stops the slice without failing the job."""

    def __init__(self, job: str, start: int, end: int, why: str) -> None:
        super().__init__(f"job {job}: slice [{start}, {end}): {why}; nothing written")
        self.job, self.why = job, why


_CHUNK = re.compile(r"^chunk-(\d+)-(\d+)\.npy$")
_STATE = re.compile(r"^state-(\d+)\.pt$")


@dataclass(frozen=True)
class Committed:
    """The commit point: work done up to ``end``, the workload state there (None at the slice's start), whether the
    slice's work is all done."""

    end: int
    state: dict[str, Any] | None
    done: bool = False
    adopted: int = 0  # commits recovery adopted
    removed: int = 0  # files recovery removed


@dataclass(frozen=True)
class Staged:
    """A commit's device part, done: what its file part writes, as bytes on the host. It continues the pointer at
    ``start`` up to ``end``; ``chunk`` is the outputs' ``.npy`` (None for training)."""

    start: int
    end: int
    state: bytes
    chunk: bytes | None

    @property
    def nbytes(self) -> int:
        return len(self.state) + len(self.chunk or b"")


class ProgressStore:
    """The commit protocol of one slice's directory (see the module docstring); ``start``: the slice's first unit."""

    def __init__(
        self,
        output_dir: Path,
        *,
        job: str,
        with_outputs: bool,
        keep_states: int = 2,
        start: int = 0,
        end: int = -1,
        epoch: int = 0,
        guard: Callable[[], str | None] | None = None,
    ) -> None:
        self.dir = output_dir
        self.epoch = epoch  # of the assignment this writer holds
        self.guard = guard  # why this writer may no longer commit (None: it may)
        self.job = job
        self.with_outputs = with_outputs
        self.keep_states = max(1, keep_states)
        self.start, self.end = start, end  # end < 0: not bounded here (the task bounds its steps)
        self.chunks_dir = output_dir / "chunks"
        self.states_dir = output_dir / "checkpoints"
        self.committed = start  # the pointer as written (durable)
        self.staged = start  # the end of the work handed to a commit (staged ≥ committed)
        self.done = False
        self._ids: list[np.ndarray] = []
        self._pending = 0  # rows buffered in _ids (counted as they come: summing per add was quadratic)
        self._values: list[np.ndarray] = []

    # -- recovery -------------------------------------------------------------------------------------------------
    def recover(self, *, lock_timeout_s: float | None = None) -> Committed:
        """Reconcile the directory with the commit pointer; returns the point to resume from. Waits for the slice's
        commit lock (a previous owner's commit in flight) for good, or ``lock_timeout_s`` (then
        :class:`pipefill_fill.locks.LockBusy`, nothing touched)."""
        for d in (self.dir, self.chunks_dir, self.states_dir):
            d.mkdir(parents=True, exist_ok=True)
        with self._fenced(lock_timeout_s=lock_timeout_s) as record:
            return self._recover(record)

    def _recover(self, record: dict[str, Any]) -> Committed:
        removed = sum(
            _unlink(p) for d in (self.dir, self.chunks_dir, self.states_dir) for p in d.glob(f".*{TMP_SUFFIX}")
        )
        end, done = int(record.get("committed", self.start)), bool(record.get("done", False))
        takeover = int(record.get("epoch", 0)) < self.epoch
        states = self._states()
        chunks = self._chunks()
        adopted = 0
        if self.with_outputs:
            by_start = {s: (s, e) for s, e in chunks}
            while end in by_start and by_start[end][1] in states and by_start[end][1] > end:
                end = by_start[end][1]
                adopted += 1
        else:
            newer = [n for n in states if n > end]
            if newer:
                end, adopted = max(newer), 1
        removed += sum(_unlink(self._chunk_path(s, e)) for s, e in chunks if s >= end)
        removed += sum(_unlink(self._state_path(n)) for n in states if n > end)
        kept = sorted((s, e) for s, e in chunks if s < end)
        if self.with_outputs:
            _check_tiling(kept, self.start, end, self.chunks_dir)
        if end > self.start and not self._state_path(end).exists():
            raise RuntimeError(
                f"{self.dir}: progress.json commits {end} units but {self._state_path(end).name} is missing; the output "
                "directory was changed by hand. Restore the file or remove the directory to start the job again"
            )
        self.committed, self.staged, self.done = end, end, done
        self._clear()
        if adopted or removed or takeover:  # a takeover is recorded before anything else: the old owner is fenced
            self._write_record()
        self._prune_states()
        state = self._load_state(end) if end > self.start else None
        return Committed(end, state, done, adopted, removed)

    # -- committing -----------------------------------------------------------------------------------------------
    def add(self, sample_ids: np.ndarray, values: np.ndarray) -> None:
        """Buffer outputs until the next commit; ids must continue exactly where the buffered ones end."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        expect = self.staged + self._pending
        n = len(ids)
        if ids.ndim != 1 or n != len(values) or not np.array_equal(ids, np.arange(expect, expect + n)):
            where = f" (this executor's slice of the job is [{self.start}, {self.end}))" if self.end >= 0 else ""
            raise ValueError(
                f"emit: sample ids must be consecutive from {expect}{where} with one value row each; got ids "
                f"{ids[:3].tolist()}… ({len(ids)}) and {len(values)} values. Start at context.start, stop before "
                "context.end and emit each batch's outputs in sample order (docs/fill.md)"
            )
        if self.end >= 0 and expect + len(ids) > self.end:
            raise ValueError(
                f"emit: sample ids up to {expect + len(ids) - 1} pass this slice's end {self.end}; a workload stops "
                "before context.end (docs/fill.md)"
            )
        self._ids.append(ids)
        self._values.append(np.ascontiguousarray(values))
        self._pending += n

    @property
    def pending(self) -> int:
        return self._pending

    def commit(self, *, end: int, state: dict[str, Any]) -> int:
        """Commit work up to ``end`` with the workload ``state`` there, both parts at once; returns the bytes written."""
        staged = self.stage(end=end, state=state)
        return self.write(staged) if staged is not None else 0

    def stage(self, *, end: int, state: dict[str, Any]) -> Staged | None:
        """The device part of a commit up to ``end``: ``state`` (the workload's, at ``end``) to the host and to bytes,
        the buffered outputs to a chunk's bytes. Nothing is written; None when nothing is new since the last stage."""
        if end < self.staged:
            raise ValueError(f"commit: end {end} is before the work already committed or staged, {self.staged}")
        if self.with_outputs and end != self.staged + self.pending:
            raise ValueError(
                f"commit: end {end} does not match the outputs emitted ({self.staged} + {self.pending}); "
                "an inference workload must emit one output per sample it counts"
            )
        if end == self.staged:
            return None
        state_bytes = serialized(state)
        chunk = None
        if self.with_outputs:
            values = np.concatenate(self._values)
            rows = np.empty(len(values), dtype=[("sample_id", "<i8"), ("value", values.dtype, values.shape[1:])])
            rows["sample_id"] = np.concatenate(self._ids)
            rows["value"] = values
            out = io.BytesIO()
            np.save(out, rows, allow_pickle=False)
            chunk = out.getvalue()
            self._clear()
        staged = Staged(self.staged, end, state_bytes, chunk)
        self.staged = end
        return staged

    def write(self, staged: Staged, *, pause: Callable[[], object] = bool) -> int:
        """The file part of a commit (any thread; commits of one store in the order staged): state file, chunk,
        pointer, under the fence; ``pause()`` before each write and fsync (:func:`atomic_write`). Returns the bytes
        written. Raises :class:`Superseded` (nothing written) when this writer no longer owns the slice."""
        with self._fenced():
            if staged.start != self.committed:
                raise RuntimeError(
                    f"{self.dir}: a commit of [{staged.start}, {staged.end}) does not continue the pointer at "
                    f"{self.committed}; commits of a store are written in the order they were staged"
                )
            atomic_write_bytes(self._state_path(staged.end), staged.state, pause=pause)
            if staged.chunk is not None:
                atomic_write_bytes(self._chunk_path(staged.start, staged.end), staged.chunk, pause=pause)
            self.committed = staged.end
            self._write_record(pause)
            self._prune_states()
        return staged.nbytes

    def _clear(self) -> None:
        self._ids.clear()
        self._values.clear()
        self._pending = 0

    def mark_done(self) -> None:
        """Record that the slice's work is all committed (after the last commit)."""
        if self.with_outputs and self.committed < self.end:  # its chunks must tile it: never a sample left out
            raise RuntimeError(f"{self.dir}: slice [{self.start}, {self.end}) marked done at {self.committed}")
        if not self.done:
            # the epoch fence only: the work is all committed, and a job the operator just saw complete (its
            # assignments cleared) must still be marked done so that its outputs are assembled
            with self._fenced(guarded=False):
                self.done = True
                self._write_record()

    @contextlib.contextmanager
    def _fenced(self, *, guarded: bool = True, lock_timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """Hold the slice's commit lock and check that this writer still owns the slice: no newer epoch in the
        pointer, and (``guarded``) the guard agrees. Yields the pointer record as read under the lock."""
        with locked(self.dir / ".commit.lock", timeout_s=lock_timeout_s):
            record = self._read_record()
            stored = int(record.get("epoch", 0))
            if stored > self.epoch:
                why = f"taken over by epoch {stored} (this executor holds epoch {self.epoch})"
                raise Superseded(self.job, self.start, self.end, why)
            why_not = self.guard() if self.guard is not None and guarded else None
            if why_not is not None:
                raise Superseded(self.job, self.start, self.end, why_not)
            yield record

    # -- helpers --------------------------------------------------------------------------------------------------
    def _read_record(self) -> dict[str, Any]:
        return _read_record(self.dir)

    def _write_record(self, pause: Callable[[], object] = bool) -> None:
        record = {
            "job": self.job,
            "start": self.start,
            "end": self.end if self.end >= 0 else None,
            "committed": self.committed,
            "epoch": self.epoch,
            "state_file": (
                f"checkpoints/{self._state_path(self.committed).name}" if self.committed > self.start else None
            ),
            "chunks": len(self._chunks()) if self.with_outputs else 0,
            "done": self.done,
            "updated_unix_s": round(time.time(), 3),
        }
        atomic_write_bytes(self.dir / "progress.json", (json.dumps(record, indent=2) + "\n").encode(), pause=pause)

    def _chunks(self) -> list[tuple[int, int]]:
        out = []
        for p in self.chunks_dir.iterdir() if self.chunks_dir.exists() else []:
            m = _CHUNK.match(p.name)
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return sorted(out)

    def _states(self) -> list[int]:
        found = (_STATE.match(p.name) for p in self.states_dir.iterdir()) if self.states_dir.exists() else iter(())
        return sorted(int(m.group(1)) for m in found if m)

    def _chunk_path(self, start: int, end: int) -> Path:
        return self.chunks_dir / f"chunk-{start:012d}-{end:012d}.npy"

    def _state_path(self, end: int) -> Path:
        return self.states_dir / f"state-{end:012d}.pt"

    def _load_state(self, end: int) -> dict[str, Any]:
        state: dict[str, Any] = torch.load(self._state_path(end), map_location="cpu", weights_only=False)
        return state

    def _prune_states(self) -> None:
        for n in [n for n in self._states() if n <= self.committed][: -self.keep_states]:
            _unlink(self._state_path(n))


def serialized(state: dict[str, Any]) -> bytes:
    """A workload state as a state file holds it (``torch.save``; device tensors are copied to the host here)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def read_pointer(directory: Path, *, start: int) -> tuple[int, bool]:
    """A store's commit pointer as its progress.json says (committed, done), without recovering it; (start, False)
    when nothing was committed yet."""
    record = _read_record(directory)
    return int(record.get("committed", start)), bool(record.get("done", False))


def slice_rows(directory: Path, *, start: int, end: int) -> list[np.ndarray]:
    """The committed output chunks of a store whose chunks tile ``[start, end)`` (a finished slice), in order."""
    chunks_dir = directory / "chunks"
    found = sorted((int(m.group(1)), int(m.group(2))) for p in chunks_dir.iterdir() if (m := _CHUNK.match(p.name)))
    kept = [(s, e) for s, e in found if start <= s and e <= end]
    _check_tiling(kept, start, end, chunks_dir)
    return [np.load(chunks_dir / f"chunk-{s:012d}-{e:012d}.npy", allow_pickle=False) for s, e in kept]


def read_outputs(output_dir: Path) -> np.ndarray:
    """All output chunks under a job's output directory (its own and its slices'), in sample order (one structured
    array: sample_id, value). Reads the files as they are: call it on a recovered or finished job."""
    dirs = [output_dir / "chunks", *sorted((output_dir / "slices").glob("*/chunks"))]
    paths = sorted((p for d in dirs if d.exists() for p in d.iterdir() if _CHUNK.match(p.name)), key=lambda p: p.name)
    parts = [np.load(p, allow_pickle=False) for p in paths]
    if not parts:
        return np.empty(0, dtype=[("sample_id", "<i8"), ("value", "<f4")])
    return np.concatenate(parts)


def _read_record(directory: Path) -> dict[str, Any]:
    try:
        record: dict[str, Any] = json.loads((directory / "progress.json").read_text())
    except FileNotFoundError:
        return {}
    return record


def _check_tiling(chunks: list[tuple[int, int]], start: int, end: int, where: Path) -> None:
    pos = start
    for s, e in chunks:
        if s != pos or e <= s:
            raise RuntimeError(
                f"{where}: chunk-{s}-{e} does not continue at sample {pos}; the chunks must tile [{start}, {end}) "
                "exactly. The directory was changed by hand or by two executors at once; remove it to start the job again"
            )
        pos = e
    if pos != end:
        raise RuntimeError(f"{where}: the chunks end at sample {pos}, but progress.json commits {end}")


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1
