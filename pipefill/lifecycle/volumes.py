"""The user's ConfigMaps and PersistentVolumeClaims that every rank pod mounts, and which of them are missing.

A pod that mounts a ConfigMap that does not exist sits in ContainerCreating (the kubelet retries the mount for
good), and one whose claim does not exist is never scheduled: neither says why on the job. So the operator creates
no pods until all of them exist, and says which one it waits for (the field that names it, the object, the fix);
the watch of each awaited object (``pipefill_operator.awaited``) wakes the job as soon as it appears. The checkpoint
claim is not listed here: it is waited for together with the check of its access modes
(:func:`pipefill.lifecycle.checks.checkpoint_sharing`), and the custom schedule's ConfigMap is read by the operator,
not mounted (:func:`pipefill.children.schedule_csv_of`).

Pure functions of the spec and of the objects read: the operator reads, this module decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipefill.spec import PipelineTrainingJob

__all__ = ["MountedObject", "missing_mounts", "mounted_objects"]

CONFIG_MAP, CLAIM = "ConfigMap", "PersistentVolumeClaim"
HF_CONFIG_KEY = "config.json"  # what a Hugging Face model's ConfigMap must hold (transformers' config file)


@dataclass(frozen=True)
class MountedObject:
    """One object the rank pods mount: its kind (ConfigMap or PersistentVolumeClaim), its name, the spec field that
    names it, and the keys a ConfigMap must hold for the trainer to start (the mount of a ConfigMap without them
    succeeds, and the trainer would then fail on every restart)."""

    kind: str
    name: str
    field: str
    keys: tuple[str, ...] = ()


def mounted_objects(job: PipelineTrainingJob) -> list[MountedObject]:
    """What the rank pods of ``job`` mount that the user creates, in the order of the spec (the checkpoint claim
    aside; see the module's docstring). ``pipefill.pods`` builds the volumes; a test holds the two lists equal."""
    spec = job.spec
    out: list[MountedObject] = []
    hf = spec.model.hugging_face
    if hf is not None and hf.claim_name:
        out.append(MountedObject(CLAIM, hf.claim_name, "spec.model.huggingFace.claimName"))
    elif hf is not None and hf.config_map:
        out.append(MountedObject(CONFIG_MAP, hf.config_map, "spec.model.huggingFace.configMap", (HF_CONFIG_KEY,)))
    code = spec.model.python.code if spec.model.python is not None else None
    if code is not None and code.config_map:
        out.append(MountedObject(CONFIG_MAP, code.config_map, "spec.model.python.code.configMap"))
    if spec.data.claim_name and spec.data.path:
        out.append(MountedObject(CLAIM, spec.data.claim_name, "spec.data.claimName"))
    if spec.fill.storage is not None:  # also where spec.model.python.code.path lives
        out.append(MountedObject(CLAIM, spec.fill.storage.claim_name, "spec.fill.storage.claimName"))
    return out


def _problem(needed: MountedObject, obj: dict[str, Any] | None) -> str | None:
    what = f"{needed.kind} {needed.name!r} ({needed.field})"
    if obj is None:
        fix = (
            f"create it (kubectl create configmap {needed.name} --from-file=...)"
            if needed.kind == CONFIG_MAP
            else "create it (a claim every rank's node can mount)"
        )
        return f"{what} does not exist: {fix} or correct {needed.field}"
    keys = {*(obj.get("data") or {}), *(obj.get("binaryData") or {})}
    absent = [k for k in needed.keys if k not in keys]
    if absent:
        has = ", ".join(sorted(keys)) or "none"
        return f"{what} has no key {', '.join(absent)} (its keys: {has}): add the model's {', '.join(absent)} to it"
    return None


def missing_mounts(
    needed: Sequence[MountedObject], found: Sequence[dict[str, Any] | None]
) -> tuple[list[MountedObject], tuple[str, str]] | None:
    """The objects of ``needed`` that are missing or incomplete (``found``: each one as read, None when absent),
    and the Waiting condition's (reason, message) naming all of them; None when the pods can be created.

    The reason is the kind of the first missing object (ConfigMapMissing or PersistentVolumeClaimMissing; a ConfigMap
    without its key counts as missing, as a custom schedule's does)."""
    problems = [(n, p) for n, obj in zip(needed, found, strict=True) if (p := _problem(n, obj)) is not None]
    if not problems:
        return None
    reason = f"{problems[0][0].kind}Missing"
    then = "the job starts once they are all there" if len(problems) > 1 else "the job starts once it is there"
    message = "; ".join(p for _, p in problems) + f"; {then}"
    return [n for n, _ in problems], (reason, message)
