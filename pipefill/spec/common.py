"""Pieces both custom resources share: conditions, storage locations, label selectors, name rules."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field

__all__ = [
    "CONFIG_MAP_NAME_PATTERN",
    "MAX_NAME_LENGTH",
    "NAME_RULE",
    "Condition",
    "LabelSelector",
    "LabelSelectorRequirement",
    "Location",
    "code_source_rules",
]

CONFIG_MAP_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


def code_source_rules(field_name: str) -> tuple[Rule, ...]:
    """The rules of a user code source (a FillJob's workload code, a model provider's code): exactly one of a
    directory on the fill storage and a ConfigMap; the directory relative and without ``..``."""
    return (
        Rule(
            rule="has(self.path) != has(self.configMap)",
            message=f"{field_name}: set exactly one of path and configMap",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="!has(self.path) || (!self.path.startsWith('/') && !self.path.matches('(^|/)[.][.](/|$)'))",
            message=f"{field_name}.path must be relative to the fill storage and must not contain '..'; "
            "give the directory's path under the storage's mount",
            field_path=".path",
        ),
    )


# Pods are named "<job>-<replica>-<rank>" plus a restart suffix; this keeps every derived name under 63 characters.
MAX_NAME_LENGTH = 48

NAME_RULE = Rule(
    rule=f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    message=f"metadata.name must be a DNS label (a-z, 0-9, '-', starting with a letter) of at most {MAX_NAME_LENGTH} characters",
    message_expression="'metadata.name %s is not allowed: use lower-case letters, digits and \\'-\\', start with a letter,"
    f" at most {MAX_NAME_LENGTH} characters (pod and service names are derived from it)'.format([self.metadata.name])",
    field_path=".metadata.name",
)


@dataclass
class Condition:
    """A Kubernetes condition (metav1.Condition shape)."""

    type: str = field(doc="Condition type, e.g. Running.", max_length=316)
    status: str = field(doc="True, False or Unknown.", pattern="^(True|False|Unknown)$")
    reason: str = field(doc="CamelCase reason for the last transition.", max_length=1024, default="")
    message: str = field(doc="Human-readable detail.", max_length=32768, default="")
    last_transition_time: str | None = field(doc="When status last changed.", fmt="date-time", default=None)
    observed_generation: int | None = field(
        doc="metadata.generation the condition was set for.", minimum=0, default=None
    )


@dataclass
class Location:
    """A file or directory, optionally on a PersistentVolumeClaim."""

    path: str = field(doc="Path inside the container.", max_length=4096)
    claim_name: str | None = field(
        doc="PersistentVolumeClaim mounted so that path exists; local runs use the path as is.",
        max_length=253,
        default=None,
    )


class SelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass
class LabelSelectorRequirement:
    """One matchExpressions entry."""

    key: str = field(doc="Label key.", max_length=317)
    operator: SelectorOperator = field(doc="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = field(
        doc="Values for In and NotIn; empty for Exists and DoesNotExist.", max_items=64, default_factory=list
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="(self.operator in ['In', 'NotIn']) == (size(self.values) > 0)",
            message="values must be non-empty for operators In and NotIn and empty for Exists and DoesNotExist",
            field_path=".values",
        ),
    )


@dataclass
class LabelSelector:
    """A Kubernetes label selector over PipelineTrainingJob labels."""

    match_labels: dict[str, str] = field(doc="Labels that must all be equal.", default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = field(
        doc="Requirements that must all hold.", max_items=32, default_factory=list
    )

    def matches(self, labels: dict[str, str]) -> bool:
        """True when ``labels`` satisfy the selector (Kubernetes semantics)."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present = req.key in labels
            ok = {
                SelectorOperator.IN: present and labels.get(req.key) in req.values,
                SelectorOperator.NOT_IN: not present or labels.get(req.key) not in req.values,
                SelectorOperator.EXISTS: present,
                SelectorOperator.DOES_NOT_EXIST: not present,
            }[req.operator]
            if not ok:
                return False
        return True
