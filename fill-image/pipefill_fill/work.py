"""What the executor works on, torch-free: a fill job as the executor sees it (:class:`TaskSpec`, built from the typed
FillJob spec so both work sources give the same) and the slices of its units of work (:class:`Slice`,
:func:`plan_slices`). The work sources need only this module; the slices' stores are in :mod:`pipefill_fill.slices`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipefill.queue.slices import MIN_SLICE_UNITS, SLICES_PER_RANK, Slice, plan_slices
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
    entry_point: str | None = None
    code_path: str | None = None  # spec.workload.code.path: relative to the fill storage
    code_config_map: str | None = None  # spec.workload.code.configMap
    namespace: str | None = None  # the FillJob's (where its code's ConfigMap is); None: local runs

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
            entry_point=spec.workload.entry_point,
            code_path=spec.workload.code.path if spec.workload.code is not None else None,
            code_config_map=spec.workload.code.config_map if spec.workload.code is not None else None,
            namespace=job.metadata.get("namespace"),
        )

    @property
    def parallel_ranks(self) -> int:
        """Executors that may work on the job at once: ``maxParallelRanks`` for inference; 1 for training (a
        sequence of optimizer steps; admission rejects more)."""
        return self.max_parallel_ranks if self.kind == "inference" else 1

    @property
    def workload_id(self) -> str:
        """What identifies the workload for the profile cache: its class and parameters."""
        what = self.builtin or self.entry_point or self.import_path or "?"
        where = f"@{self.code_path or self.code_config_map}" if self.code_path or self.code_config_map else ""
        return f"{what}{where}:{sorted(self.parameters.items())!r}"
