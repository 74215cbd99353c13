"""What the executor works on, torch-free: a fill job as the executor sees it (:class:`TaskSpec`, built from the typed
FillJob spec so both work sources give the same) and the slices of its units of work (:class:`Slice`,
:func:`plan_slices`). The work sources need only this module; the slices' stores are in :mod:`pipefill_fill.slices`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipefill.spec import FillJob

__all__ = ["MIN_SLICE_UNITS", "SLICES_PER_RANK", "Slice", "TaskSpec", "plan_slices"]


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
    max_parallel_ranks: int = 1

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
            max_parallel_ranks=spec.max_parallel_ranks,
        )

    @property
    def parallel_ranks(self) -> int:
        """Executors that may work on the job at once: ``maxParallelRanks`` for inference; 1 for training (a
        sequence of optimizer steps; admission rejects more)."""
        return self.max_parallel_ranks if self.kind == "inference" else 1

    @property
    def workload_id(self) -> str:
        """What identifies the workload for the profile cache: its class and parameters."""
        what = self.builtin or self.import_path or "?"
        return f"{what}:{sorted(self.parameters.items())!r}"


SLICES_PER_RANK = 4
"""Slices per allowed rank (spec.maxParallelRanks): several, so a faster rank takes more and the tail is short."""
MIN_SLICE_UNITS = 64
"""No slice is smaller than this many samples: every slice costs a workload setup and files of its own."""


@dataclass(frozen=True, order=True)
class Slice:
    """Units of work ``[start, end)`` of one job (samples; steps for training, which is never split)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"a slice needs 0 ≤ start < end; got [{self.start}, {self.end})")

    @property
    def key(self) -> str:
        return f"{self.start:012d}-{self.end:012d}"

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


def plan_slices(total: int, *, parallel_ranks: int) -> list[Slice]:
    """Equal slices of ``[0, total)``: ``SLICES_PER_RANK`` per rank, none below ``MIN_SLICE_UNITS``; one slice when
    only one rank may work on the job."""
    count = 1 if parallel_ranks <= 1 else max(1, min(parallel_ranks * SLICES_PER_RANK, total // MIN_SLICE_UNITS))
    bounds = [total * i // count for i in range(count + 1)]
    return [Slice(a, b) for a, b in itertools.pairwise(bounds)]
