"""What the executor works on, torch-free: a fill job as the executor sees it (:class:`TaskSpec`, built from the typed
FillJob spec so both work sources give the same) with its plan of record, the slices of its units of work
(:class:`Slice`; the plan itself is :func:`pipefill.queue.plan_slices`, written into the FillJob status by the
operator, or by the files source in local runs). The work sources need only this module; the slices' stores are in
:mod:`pipefill_fill.slices`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipefill.queue.slices import MIN_SLICE_UNITS, Slice, check_plan
from pipefill.spec import FillJob
from pipefill.spec.common import Location

__all__ = ["Slice", "TaskSpec"]


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
    min_slice_units: int = MIN_SLICE_UNITS  # spec.minSliceSamples
    entry_point: str | None = None
    code_path: str | None = None  # spec.workload.code.path: relative to the fill storage
    code_config_map: str | None = None  # spec.workload.code.configMap
    namespace: str | None = None  # the FillJob's (where its code's ConfigMap is); None: local runs
    plan: tuple[Slice, ...] = ()
    """The plan of record (``status.slices``): the slices every executor runs; empty: one slice, the whole job (a
    runner that does not split, such as the benchmark's)."""

    def __post_init__(self) -> None:
        if self.plan:
            check_plan(self.plan, total=self.total, field=f"FillJob {self.name}: status.slices")

    @classmethod
    def from_spec(
        cls,
        job: FillJob,
        *,
        base_dir: Path | None = None,
        plan: Sequence[Slice] = (),
        storage_dir: Path | None = None,
    ) -> TaskSpec:
        """``base_dir`` resolves relative paths (the manifests' directory's working dir in local runs); ``plan``: the
        plan of record from the job's status (checked: it must tile ``[0, total)``); ``storage_dir``: where the
        training job's fill storage is mounted (``PIPEFILL_FILL_STORAGE_DIR``), under which a location with a
        ``claimName`` is a path relative to the claim's root (docs/fill.md, "Fill storage")."""
        spec = job.spec

        def resolve(location: Location) -> Path:
            if location.claim_name and storage_dir is not None:
                return storage_dir / location.path.lstrip("/")
            p = Path(location.path)
            return p if p.is_absolute() or base_dir is None else base_dir / p

        return cls(
            name=job.name,
            kind=str(spec.workload.kind),
            builtin=spec.workload.builtin,
            import_path=spec.workload.import_path,
            parameters=dict(spec.workload.parameters),
            total=spec.total,
            counts_steps=spec.total_samples is None,
            output_dir=resolve(spec.output),
            input_path=resolve(spec.input) if spec.input is not None else None,
            priority=spec.priority,
            labels=tuple(sorted((str(k), str(v)) for k, v in (job.metadata.get("labels") or {}).items())),
            max_parallel_ranks=spec.max_parallel_ranks,
            min_slice_units=spec.min_slice_samples,
            entry_point=spec.workload.entry_point,
            code_path=spec.workload.code.path if spec.workload.code is not None else None,
            code_config_map=spec.workload.code.config_map if spec.workload.code is not None else None,
            namespace=job.metadata.get("namespace"),
            plan=tuple(sorted(plan)),
        )

    @property
    def slices(self) -> list[Slice]:
        """The slices to run: the plan of record, or ``[0, total)`` whole when there is none."""
        return list(self.plan) or [Slice(0, self.total)]

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
