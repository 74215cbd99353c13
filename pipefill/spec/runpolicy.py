"""How a job survives failures and ends: checkpoints, whole-job restarts, lifetime limits."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.immutable import immutable

__all__ = ["Checkpoint", "CheckpointFormat", "RunPolicy"]


class CheckpointFormat(enum.StrEnum):
    TORCH = "torch"
    DCP = "dcp"


@dataclass
class Checkpoint:
    """Where and how often each rank saves its state (atomically: write, then rename)."""

    path: str = field(doc="Directory inside the trainer container.", max_length=4096, default="/checkpoints")
    claim_name: str | None = field(
        doc="PersistentVolumeClaim mounted at path; without one checkpoints live in an emptyDir and survive container restarts only.",
        max_length=253,
        default=None,
    )
    interval_steps: int = field(doc="Save every N steps; 0 saves only at the end.", minimum=0, maximum=10**9, default=0)
    format: CheckpointFormat | None = field(
        doc="torch: one file per rank (torch.save); dcp: torch.distributed.checkpoint, the stages' tensors under the "
        "whole model's names, optimizer state flattened per parameter. Default: dcp for spec.model.huggingFace, "
        "torch for our GPT. A resume reads whichever format the checkpoint is in.",
        default=None,
    )

    # Where the job's progress is kept: a new place would start the next gang at step 0 (and a new format could not
    # read the old one), while the job counts its steps on (docs/operator.md, "Changing a running job").
    __rules__: ClassVar[tuple[Rule, ...]] = tuple(
        immutable(
            camel,
            path=f"spec.checkpoint.{camel}",
            why=why,
            instead="to start over elsewhere, delete the job and create it again",
        )
        for camel, why in (
            ("path", "the job's checkpoints are there and the next gang resumes from them"),
            ("claimName", "the job's checkpoints are on it and the next gang resumes from them"),
            ("format", "the job's checkpoints are written in it and the next gang resumes from them"),
        )
    )


@dataclass
class RunPolicy:
    """Restart and lifetime policy."""

    backoff_limit: int = field(
        doc="Whole-job restarts from the last checkpoint before the job fails.", minimum=0, maximum=1000, default=3
    )
    restart_on_exit_codes: list[int] = field(
        doc="Trainer exit codes that count as retryable.", max_items=64, default_factory=lambda: [75, 137, 143]
    )
    suspend: bool = field(doc="Suspended jobs have no pods (Kueue sets this).", default=False)
    ttl_seconds_after_finished: int | None = field(
        doc="Delete the job this long after it finished.", unit="s", minimum=0, maximum=10**9, default=None
    )
    active_deadline_seconds: int | None = field(
        doc="Fail the job after this long running.", unit="s", minimum=1, maximum=10**9, default=None
    )
    termination_grace_period_seconds: int = field(
        doc="Seconds a rank pod gets between SIGTERM and SIGKILL (the pod's terminationGracePeriodSeconds): long "
        "enough for the trainer to write its checkpoint when it is stopped (suspend, restart, deletion).",
        unit="s",
        minimum=1,
        maximum=86400,
        default=120,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.restartOnExitCodes.all(c, c >= 1 && c <= 255)",
            message="spec.runPolicy.restartOnExitCodes entries must be exit codes 1–255",
            field_path=".restartOnExitCodes",
        ),
    )
