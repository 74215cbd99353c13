"""The spec a job's running gang was built from, for the SpecChangePending condition to name what an edit changed.

Read only when the job's spec changed under its running pods (their ``pipefill.io/spec-generation`` label is older
than the job's ``metadata.generation``), once per job and spec generation: from one such pod's spec annotation (a
list of that pod by its labels), or,
for the jobs whose pods mount it instead, the spec ConfigMap (brought up to date only when the next gang is
created, so it still holds the running gang's spec). The pod cache keeps neither (a pod's spec annotation is the
size of the spec); without an answer the condition says that the change waits, without naming fields.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import yaml

from pipefill.children import JOB_LABEL, SPEC_ANNOTATION, SPEC_KEY, spec_config_name
from pipefill.lifecycle import PodView
from pipefill.pods import RANK_LABEL, SPEC_GENERATION_LABEL
from pipefill.spec import PipelineTrainingJob
from pipefill.spec.loader import SAFE_LOADER
from pipefill_operator.kube import ApiError, Kube, resource_of

__all__ = ["RunningSpecs"]

log = logging.getLogger("pipefill_operator")
POD = resource_of("v1", "Pod")
CONFIG_MAP = resource_of("v1", "ConfigMap")


class RunningSpecs:
    """The running gangs' specs this operator has read, by (job uid, spec generation)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._specs: dict[tuple[str, int], dict[str, Any] | None] = {}

    def forget(self, uid: str) -> None:
        self._specs = {k: v for k, v in self._specs.items() if k[0] != uid}

    async def of(
        self, job: PipelineTrainingJob, *, namespace: str, uid: str, generation: int, pods: Sequence[PodView]
    ) -> dict[str, Any] | None:
        """The spec (as :func:`pipefill.spec.to_obj` wrote it) the oldest-built of ``pods`` was made from, when the
        job's ``generation`` is newer; None otherwise or when it cannot be read."""
        built = [(p.spec_generation, p.rank) for p in pods if p.spec_generation is not None]
        if not built:
            return None
        oldest, rank = min(built)
        if oldest >= generation:
            return None
        mark = (uid, oldest)
        if mark not in self._specs:
            try:
                document = await self._document(job, namespace, rank, oldest)
            except (ApiError, TimeoutError) as exc:
                log.warning("the running spec of %s/%s was not read: %s", namespace, job.name, exc)
                return None  # not remembered: asked again at the next look
            self._specs = {k: v for k, v in self._specs.items() if k[0] != uid}
            self._specs[mark] = _spec_of(document)
        return self._specs[mark]

    async def _document(self, job: PipelineTrainingJob, namespace: str, rank: int, built: int) -> str | None:
        # a list of the one pod, by its labels: the operator lists pods anyway, and needs no grant to get one
        selector = f"{JOB_LABEL}={job.name},{RANK_LABEL}={rank},{SPEC_GENERATION_LABEL}={built}"
        for pod in await self.kube.list(POD, namespace, label_selector=selector):
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if SPEC_ANNOTATION in annotations:
                return str(annotations[SPEC_ANNOTATION])
        config_map = await self.kube.get(CONFIG_MAP, spec_config_name(job), namespace)
        data = (config_map or {}).get("data") or {}
        return str(data[SPEC_KEY]) if SPEC_KEY in data else None


def _spec_of(document: str | None) -> dict[str, Any] | None:
    if document is None:
        return None
    try:
        obj = yaml.load(document, Loader=SAFE_LOADER)
    except yaml.YAMLError:
        return None
    spec = obj.get("spec") if isinstance(obj, dict) else None
    return spec if isinstance(spec, dict) else None
