"""What the operator checks that admission cannot, and what it warns about.

Each problem is a message naming the field, the value, the rule and the fix, reported as the InvalidSpec condition
(once: the job is not retried until its spec changes). The schedule comes from the same shape derivation as the
trainer's (``pipefill.spec.shape``), so a spec the trainer would refuse at start-up is refused before any pod is
created.
"""

from __future__ import annotations

from typing import Any

from pipefill.overlay import OverlayError
from pipefill.pods import rank_pod
from pipefill.spec import PipelineTrainingJob, Schedule, SharingMode
from pipefill.spec.shape import ShapeError, from_spec, shape_errors

__all__ = ["checkpoint_sharing", "spec_problems"]


def _shape_problems(job: PipelineTrainingJob, schedule_csv: str | None) -> list[str]:
    """The schedule's and the layer cut's rules, from the one shape derivation the trainer uses."""
    if job.spec.pipeline.schedule == Schedule.CUSTOM:
        if schedule_csv is None:
            return []  # the job waits for its ConfigMap; checked once the CSV is there
        try:
            from_spec(job, schedule_csv=schedule_csv)
        except ShapeError as exc:
            return [e.text for e in exc.errors]
        return []
    return [e.text for e in shape_errors(job)]


def _gpu_problem(job: PipelineTrainingJob) -> str | None:
    spec = job.spec
    if spec.gpu_sharing.mode == SharingMode.VISIBLE_DEVICES and spec.resources.gpus > 1:
        return (
            f"spec.resources.gpus: Invalid value: {spec.resources.gpus}: gpuSharing.mode visibleDevices shares "
            "exactly one GPU per rank (the fill executor selects the trainer's GPU by the UUID it publishes); "
            "use gpus: 1 or gpuSharing.mode: dra"
        )
    return None


def spec_problems(job: PipelineTrainingJob, *, schedule_csv: str | None = None) -> list[str]:
    """Every reason ``job`` can never run, beyond the CRD's schema and CEL rules; empty when it can."""
    problems = _shape_problems(job, schedule_csv)
    if gpu := _gpu_problem(job):
        problems.append(gpu)
    try:
        rank_pod(job, 0)
    except OverlayError as exc:
        problems.extend(str(e) for e in exc.errors)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def checkpoint_sharing(job: PipelineTrainingJob, claim: dict[str, Any] | None) -> tuple[bool, str, str]:
    """(shared, reason, message): does a restarted gang find the checkpoints its ranks wrote?

    ``claim`` is the PersistentVolumeClaim named by ``spec.checkpoint.claimName`` (None when it does not exist).
    """
    name = job.spec.checkpoint.claim_name
    if name is None:
        return (
            False,
            "CheckpointsNotShared",
            "spec.checkpoint has no claimName: checkpoints live in each pod's emptyDir and a restart begins at step "
            "0; set spec.checkpoint.claimName to a ReadWriteMany PersistentVolumeClaim",
        )
    if claim is None:
        return (
            False,
            "CheckpointClaimMissing",
            f"PersistentVolumeClaim {name!r} (spec.checkpoint.claimName) does not exist",
        )
    modes = set((claim.get("spec") or {}).get("accessModes") or ())
    if "ReadWriteMany" in modes or (job.world_size == 1 and modes & {"ReadWriteOnce", "ReadWriteOncePod"}):
        return True, "SharedVolume", f"checkpoints on PersistentVolumeClaim {name!r}"
    return (
        False,
        "CheckpointsNotShared",
        f"PersistentVolumeClaim {name!r} has access modes {sorted(modes)}: ranks on different nodes cannot all "
        "mount it; use a ReadWriteMany claim",
    )
