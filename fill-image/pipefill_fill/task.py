"""One fill job in the executor: its workload, its exactly-once store, and the commit policy between them."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipefill.spec import FillJob
from pipefill_fill.store import Committed, ProgressStore
from pipefill_fill.workload import WorkloadContext, WorkloadProtocol, load_workload_class

__all__ = ["FillTask", "TaskSpec"]

log = logging.getLogger("pipefill_fill")


@dataclass(frozen=True)
class TaskSpec:
    """What the executor needs of a FillJob (built from the typed spec, so both work sources give the same)."""

    name: str
    kind: str
    builtin: str | None
    import_path: str | None
    parameters: dict[str, Any]
    total: int
    counts_steps: bool
    output_dir: Path
    input_path: Path | None
    priority: int = 0
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_spec(cls, job: FillJob, *, base_dir: Path | None = None) -> TaskSpec:
        """``base_dir`` resolves relative paths (the manifests' directory's working dir in local runs)."""
        spec = job.spec

        def resolve(path: str) -> Path:
            p = Path(path)
            return p if p.is_absolute() or base_dir is None else base_dir / p

        return cls(
            name=job.name,
            kind=str(spec.workload.kind),
            builtin=spec.workload.builtin,
            import_path=spec.workload.import_path,
            parameters=dict(spec.workload.parameters),
            total=spec.total,
            counts_steps=spec.total_samples is None,
            output_dir=resolve(spec.output.path),
            input_path=resolve(spec.input.path) if spec.input is not None else None,
            priority=spec.priority,
            labels=tuple(sorted((str(k), str(v)) for k, v in (job.metadata.get("labels") or {}).items())),
        )

    @property
    def workload_id(self) -> str:
        """What identifies the workload for the profile cache: its class and parameters."""
        what = self.builtin or self.import_path or "?"
        return f"{what}:{sorted(self.parameters.items())!r}"


class FillTask:
    """Drives one job: ``open`` recovers and restores, ``step`` runs one batch, ``commit`` makes work durable."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        cls = load_workload_class(builtin=spec.builtin, import_path=spec.import_path, kind=spec.kind)
        self.store = ProgressStore(spec.output_dir, job=spec.name, with_outputs=spec.kind == "inference")
        self.context = WorkloadContext(
            name=spec.name,
            parameters=spec.parameters,
            total=spec.total,
            output_dir=spec.output_dir,
            input_path=spec.input_path,
            counts_steps=spec.counts_steps,
            emit_fn=self._emit,
        )
        self.workload: WorkloadProtocol = cls(self.context)
        self.progress = 0  # units done, committed or not
        self.recovered: Committed | None = None
        self._profiling = False
        self._committed_at = time.monotonic()

    def open(self, *, device: torch.device, memory_budget_bytes: int) -> Committed:
        """Recover the output directory, set the workload up and restore its committed state."""
        recovered = self.store.recover()
        self.workload.setup(device, memory_budget_bytes)
        if recovered.state is not None:
            self.workload.restore(recovered.state)
        self.progress = recovered.end
        self.recovered = recovered
        log.info(
            "job %s: resuming at %d/%d (adopted %d, removed %d files)%s",
            self.spec.name,
            recovered.end,
            self.spec.total,
            recovered.adopted,
            recovered.removed,
            " — already done" if recovered.done else "",
        )
        return recovered

    @property
    def committed(self) -> int:
        return self.store.committed

    @property
    def finished(self) -> bool:
        return self.store.done

    def done(self) -> bool:
        return bool(self.workload.done())

    def step(self, batch_size: int) -> int:
        items = int(self.workload.step(batch_size))
        self.progress += items
        return items

    def commit_due(self, *, min_interval_s: float = 1.0) -> bool:
        """Whether uncommitted work should be committed now: for inference at most every ``min_interval_s`` (a crash
        redoes at most that much), for training at the workload's checkpoint cadence (``commit_every`` units)."""
        uncommitted = self.progress - self.store.committed
        if uncommitted <= 0:
            return False
        if self.done():
            return True
        every = getattr(self.workload, "commit_every", None)
        if every is not None:
            return uncommitted >= int(every)
        return time.monotonic() - self._committed_at >= min_interval_s

    def commit(self) -> int:
        """Commit everything done so far; returns the bytes written."""
        written = self.store.commit(end=self.progress, state=self.workload.state())
        self._committed_at = time.monotonic()
        return written

    def finish(self) -> None:
        """After the last step: commit, finalize the workload, mark the job done (all idempotent)."""
        self.commit()
        finalize = getattr(self.workload, "finalize", None)
        if callable(finalize):
            finalize()
        self.store.mark_done()

    def snapshot(self) -> dict[str, Any]:
        """The workload state now, for the profiler to go back to after measuring."""
        return dict(self.workload.state())

    def begin_profiling(self) -> None:
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
