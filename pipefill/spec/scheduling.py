"""Where and when the gang of rank pods is placed: scheduler, gang mechanism, queue, priority, disruption budget.

One model per mechanism (docs/operator.md#gang-scheduling): ``gang`` picks who holds the pods back until all of them
fit — the PodGroup of Kubernetes' own gang scheduling (``scheduling.k8s.io/v1alpha2``, alpha), of Volcano or of the
scheduler-plugins coscheduling plugin — and ``queueName`` hands the gang to Kueue as one plain-pod group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.immutable import immutable

__all__ = ["GangMode", "Scheduling"]


class GangMode(enum.StrEnum):
    NONE = "none"
    KUBERNETES = "kubernetes"
    VOLCANO = "volcano"
    COSCHEDULING = "coscheduling"


@dataclass
class Scheduling:
    """Gang scheduling and queueing."""

    scheduler_name: str | None = field(
        doc="Pod scheduler; default: default-scheduler, volcano for gang volcano, scheduler-plugins-scheduler for "
        "gang coscheduling.",
        max_length=253,
        default=None,
    )
    gang: GangMode = field(
        doc="Who schedules the ranks all or nothing: none; kubernetes (PodGroup scheduling.k8s.io/v1alpha2, "
        "Kubernetes >= 1.36 with the GenericWorkload and GangScheduling feature gates); volcano (PodGroup "
        "scheduling.volcano.sh/v1beta1); coscheduling (PodGroup scheduling.x-k8s.io/v1alpha1 of scheduler-plugins).",
        default=GangMode.NONE,
    )
    queue_name: str | None = field(
        doc="Kueue LocalQueue: the rank pods join Kueue as one plain-pod group (label kueue.x-k8s.io/queue-name).",
        max_length=63,
        default=None,
    )
    priority_class_name: str | None = field(doc="PriorityClass of the pods.", max_length=253, default=None)
    gang_min_members: int | None = field(
        doc="PodGroup minMember (minCount); default: all ranks, since a pipeline cannot run with a rank missing.",
        minimum=1,
        maximum=1048576,
        default=None,
    )
    pod_disruption_budget: bool = field(
        doc="Create a PodDisruptionBudget that allows no voluntary eviction of a running gang (a drain then waits "
        "for the job instead of restarting it from its checkpoint).",
        default=False,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="!has(self.gangMinMembers) || self.gang != 'none'",
            message="spec.scheduling.gangMinMembers needs a gang mechanism: set spec.scheduling.gang "
            "(kubernetes, volcano or coscheduling) or drop gangMinMembers",
            field_path=".gangMinMembers",
        ),
        # The job's PodGroup is made once, when its first gang starts, and is never rewritten (docs/operator.md,
        # "Changing a running job").
        immutable("gang", path="spec.scheduling.gang", why="the job's PodGroup is made when it first starts"),
        immutable(
            "gangMinMembers",
            path="spec.scheduling.gangMinMembers",
            why="the job's PodGroup is made when it first starts",
        ),
        immutable(
            "priorityClassName",
            path="spec.scheduling.priorityClassName",
            why="with gang volcano the job's PodGroup carries it, made when the job first starts",
            when="self.gang == 'volcano'",
        ),
        immutable(
            "podDisruptionBudget",
            path="spec.scheduling.podDisruptionBudget",
            why="the job's PodDisruptionBudget is made (or not) when it first starts",
        ),
    )
