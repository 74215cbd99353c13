"""The two CustomResourceDefinitions, generated from the spec models (``make crds``; checked by ``make lint``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipefill.spec._schema import openapi
from pipefill.spec.filljob import FillJob
from pipefill.spec.training import PipelineTrainingJob

__all__ = ["GROUP", "KINDS", "VERSION", "CrdKind", "crd", "object_schema"]

GROUP = "pipefill.io"
VERSION = "v1alpha1"


@dataclass(frozen=True)
class CrdKind:
    """Names and printer columns of one custom resource."""

    model: type[Any]
    kind: str
    plural: str
    short_name: str
    columns: tuple[tuple[str, str, str, str], ...]  # (name, type, JSONPath, description)

    @property
    def file_name(self) -> str:
        return f"{GROUP}_{self.plural}.yaml"


KINDS: dict[str, CrdKind] = {
    "PipelineTrainingJob": CrdKind(
        model=PipelineTrainingJob,
        kind="PipelineTrainingJob",
        plural="pipelinetrainingjobs",
        short_name="ptj",
        columns=(
            ("Phase", "string", ".status.phase", "Lifecycle phase"),
            ("Step", "integer", ".status.currentStep", "Last completed optimizer step"),
            ("Steps", "integer", ".spec.steps", "Steps to train"),
            ("Progress", "number", ".status.progress", "Percent of the steps done"),
            ("Loss", "number", ".status.loss", "Training loss of the last step reported"),
            ("ETA", "string", ".status.estimatedCompletionTime", "When the last step should end"),
            ("Stages", "integer", ".spec.pipeline.stages", "Pipeline stages"),
            ("Schedule", "string", ".spec.pipeline.schedule", "Pipeline schedule"),
            ("Bubble", "number", ".status.bubbleFraction", "Idle fraction of step time"),
            ("Fill", "number", ".status.fillUtilization", "Fill busy time over bubble time"),
            ("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
        ),
    ),
    "FillJob": CrdKind(
        model=FillJob,
        kind="FillJob",
        plural="filljobs",
        short_name="fj",
        columns=(
            ("Phase", "string", ".status.phase", "Lifecycle phase"),
            ("Kind", "string", ".spec.workload.kind", "inference or training"),
            ("Done", "integer", ".status.samplesDone", "Committed samples or steps"),
            ("Progress", "number", ".status.progress", "Percent done"),
            ("Priority", "integer", ".spec.priority", "Higher runs first"),
            ("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
        ),
    ),
}


def object_schema(kind: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one kind, as the API server gets it."""
    schema = openapi(KINDS[kind].model)
    props = schema["properties"]
    # The API server owns metadata; defaults at the root are not allowed.
    props["metadata"] = {"type": "object"}
    for key in ("apiVersion", "kind"):
        props[key] = {"type": "string", "description": props[key]["description"]}
    schema["required"] = ["spec"]
    return schema


def crd(kind: str) -> dict[str, Any]:
    """The whole ``apiextensions.k8s.io/v1`` CustomResourceDefinition of one kind."""
    info = KINDS[kind]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{info.plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "pipefill"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.kind.lower(),
                "shortNames": [info.short_name],
                "categories": ["pipefill"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p, "description": d} for n, t, p, d in info.columns
                    ],
                    "schema": {"openAPIV3Schema": object_schema(kind)},
                }
            ],
        },
    }
