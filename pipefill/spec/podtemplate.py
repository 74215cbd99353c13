"""``spec.podTemplate``: what users add to every rank pod (scheduling constraints, secrets, volumes, RDMA/NCCL setup).

An overlay, not a whole PodTemplateSpec: the rank pod's containers, commands, ports, channel and token stay the
operator's (``pipefill.pods``), and the overlay may only add to them. What it may not touch (our labels, volumes,
mount paths and environment variables) is refused with the field named (``pipefill.overlay``); what the API server
checks anyway (an affinity term, a volume source's fields) is kept free-form and left to it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from pipefill.spec._schema import Rule, field

__all__ = [
    "ContainerOverlay",
    "EnvFrom",
    "EnvSource",
    "EnvVar",
    "ExtraResources",
    "HostAlias",
    "KeyRef",
    "NameRef",
    "PodSecurity",
    "PodTemplate",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
    "Volume",
    "VolumeMount",
]

_DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_VOLUME_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "hostPath", "nfs", "csi", "ephemeral")


def _exactly_one(*names: str) -> str:
    return " + ".join(f"(has(self.{n}) ? 1 : 0)" for n in names) + " == 1"


class TolerationOperator(enum.StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass
class Toleration:
    """A pod toleration, e.g. of a dedicated GPU node's taint ``nvidia.com/gpu=present:NoSchedule``."""

    key: str | None = field(
        doc="Taint key; empty with operator Exists tolerates every taint.", max_length=317, default=None
    )
    operator: TolerationOperator = field(
        doc="Equal (key and value) or Exists (key only).", default=TolerationOperator.EQUAL
    )
    value: str | None = field(doc="Taint value, for operator Equal.", max_length=63, default=None)
    effect: TaintEffect | None = field(doc="Taint effect to tolerate; empty: all effects.", default=None)
    toleration_seconds: int | None = field(
        doc="How long a NoExecute taint is tolerated before eviction; empty: forever.",
        unit="s",
        minimum=0,
        maximum=10**9,
        default=None,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.operator != 'Exists' || !has(self.value)",
            message="a toleration with operator Exists takes no value: drop value or use operator Equal",
            field_path=".value",
        ),
        Rule(
            rule="has(self.key) || self.operator == 'Exists'",
            message="a toleration without key must use operator Exists (it then tolerates every taint)",
            field_path=".operator",
        ),
        Rule(
            rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds applies to effect NoExecute only: set effect: NoExecute or drop it",
            field_path=".tolerationSeconds",
        ),
    )


@dataclass
class KeyRef:
    """One key of a Secret or ConfigMap in the job's namespace."""

    name: str = field(doc="Secret or ConfigMap name.", max_length=253)
    key: str = field(doc="Key inside it.", max_length=253)
    optional: bool = field(doc="Start the container even if the object or key is missing.", default=False)


@dataclass
class EnvSource:
    """Where an environment variable's value comes from."""

    secret_key_ref: KeyRef | None = field(doc="A key of a Secret (tokens, passwords).", default=None)
    config_map_key_ref: KeyRef | None = field(doc="A key of a ConfigMap.", default=None)

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule=_exactly_one("secretKeyRef", "configMapKeyRef"),
            message="valueFrom needs exactly one of secretKeyRef and configMapKeyRef",
        ),
    )


@dataclass
class EnvVar:
    """An extra environment variable, e.g. ``NCCL_IB_HCA`` or a token from a Secret."""

    name: str = field(doc="Variable name.", pattern="^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=253)
    value: str | None = field(doc="Literal value.", max_length=32768, default=None)
    value_from: EnvSource | None = field(doc="Value from a Secret or ConfigMap key.", default=None)

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="!(has(self.value) && has(self.valueFrom))",
            message="an env entry takes value or valueFrom, not both",
            field_path=".valueFrom",
        ),
    )


@dataclass
class NameRef:
    """A whole Secret or ConfigMap in the job's namespace."""

    name: str = field(doc="Object name.", max_length=253)
    optional: bool = field(doc="Start the container even if it is missing.", default=False)


@dataclass
class EnvFrom:
    """Every key of a Secret or ConfigMap as environment variables."""

    secret_ref: NameRef | None = field(doc="A Secret.", default=None)
    config_map_ref: NameRef | None = field(doc="A ConfigMap.", default=None)
    prefix: str | None = field(doc="Prepended to every key.", max_length=253, default=None)

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule=_exactly_one("secretRef", "configMapRef"),
            message="envFrom entries need exactly one of secretRef and configMapRef",
        ),
    )


@dataclass
class VolumeMount:
    """Where a volume of ``spec.podTemplate.volumes`` appears in a container."""

    name: str = field(doc="Name of a volume in spec.podTemplate.volumes.", pattern=_DNS_LABEL, max_length=63)
    mount_path: str = field(doc="Absolute path in the container.", pattern="^/", max_length=4096)
    read_only: bool = field(doc="Mount read-only.", default=False)
    sub_path: str | None = field(doc="Mount only this path inside the volume.", max_length=4096, default=None)


@dataclass
class ExtraResources:
    """Resources beyond the rank's CPU, memory and GPUs, e.g. RDMA devices ``rdma/hca_shared_devices_a: 1``."""

    requests: dict[str, int | str] = field(doc="Extra requests (quantities).", quantity=True, default_factory=dict)
    limits: dict[str, int | str] = field(doc="Extra limits (quantities).", quantity=True, default_factory=dict)


@dataclass
class ContainerOverlay:
    """What one container gets beyond what the operator gives it."""

    env: list[EnvVar] = field(doc="Extra environment variables.", max_items=128, default_factory=list)
    env_from: list[EnvFrom] = field(doc="Secrets or ConfigMaps as environment.", max_items=16, default_factory=list)
    volume_mounts: list[VolumeMount] = field(
        doc="Mounts of spec.podTemplate.volumes.", max_items=32, default_factory=list
    )
    resources: ExtraResources = field(doc="Extra resources.", default_factory=lambda: ExtraResources())


@dataclass
class Volume:
    """An extra pod volume: a name and one source, whose fields are those of the Kubernetes Volume."""

    name: str = field(doc="Volume name, referenced by volumeMounts.", pattern=_DNS_LABEL, max_length=63)
    persistent_volume_claim: dict[str, Any] | None = field(doc="PersistentVolumeClaim source.", default=None)
    config_map: dict[str, Any] | None = field(doc="ConfigMap source.", default=None)
    secret: dict[str, Any] | None = field(doc="Secret source.", default=None)
    empty_dir: dict[str, Any] | None = field(doc="emptyDir source.", default=None)
    host_path: dict[str, Any] | None = field(doc="hostPath source (e.g. /dev/infiniband).", default=None)
    nfs: dict[str, Any] | None = field(doc="NFS source.", default=None)
    csi: dict[str, Any] | None = field(doc="CSI source.", default=None)
    ephemeral: dict[str, Any] | None = field(doc="Generic ephemeral volume source.", default=None)

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule=_exactly_one(*_VOLUME_SOURCES),
            message="a volume needs exactly one source: " + ", ".join(_VOLUME_SOURCES),
        ),
    )


@dataclass
class HostAlias:
    """An ``/etc/hosts`` entry of every rank pod: names that must resolve where no cluster DNS answers them (a
    ``hostNetwork`` job on a cluster without DNS: ``MASTER_ADDR``, ``<job>-0.<job>``, at the node of rank 0)."""

    ip: str = field(doc="IPv4 or IPv6 address.", pattern="^[0-9a-fA-F.:]+$", max_length=45)
    hostnames: list[str] = field(doc="Names for it.", max_items=16)


@dataclass
class PodSecurity:
    """The numeric, non-root identity the containers run as (images must not rely on a user name)."""

    run_as_user: int = field(doc="UID of both containers; never 0.", minimum=1, maximum=2**31 - 1, default=1000)
    run_as_group: int = field(doc="Primary GID of both containers.", minimum=0, maximum=2**31 - 1, default=1000)
    fs_group: int = field(
        doc="GID owning the pod's volumes, so a checkpoint volume is writable.",
        minimum=0,
        maximum=2**31 - 1,
        default=1000,
    )


@dataclass
class PodTemplate:
    """Merged into every rank pod; may add to the operator's pod, never replace what it sets."""

    labels: dict[str, str] = field(doc="Extra pod labels (not pipefill.io/*).", default_factory=dict)
    annotations: dict[str, str] = field(doc="Extra pod annotations.", default_factory=dict)
    node_selector: dict[str, str] = field(doc="Node labels the pods require.", default_factory=dict)
    tolerations: list[Toleration] = field(
        doc="Tolerations, e.g. of dedicated GPU nodes.", max_items=64, default_factory=list
    )
    affinity: dict[str, Any] | None = field(
        doc="Pod affinity (Kubernetes Affinity), checked by the API server.", default=None
    )
    image_pull_secrets: list[str] = field(
        doc="Secret names for pulling the images.", max_items=16, default_factory=list
    )
    volumes: list[Volume] = field(
        doc="Extra volumes, mounted through trainer/fill volumeMounts.", max_items=32, default_factory=list
    )
    host_network: bool = field(
        doc="Use the node's network (RDMA/NCCL setups); ports then differ per rank so ranks can share a node.",
        default=False,
    )
    host_port_base: int | None = field(
        doc="With hostNetwork: the first of the node ports the rank pods take — rank 0's rendezvous (MASTER_PORT) "
        "here, then a trainer and a fill-executor metrics port per rank above it (1 + 2 × ranks, at most 1025). "
        "Default 29500, clear of the ports node agents listen on (DCGM exporter 9400); set another where something "
        "on the nodes holds one of them.",
        minimum=1024,
        maximum=64510,
        default=None,
    )
    host_aliases: list[HostAlias] = field(
        doc="Extra /etc/hosts entries of every rank pod (names no cluster DNS resolves).",
        max_items=16,
        default_factory=list,
    )
    security: PodSecurity = field(doc="User and groups of the containers.", default_factory=lambda: PodSecurity())
    trainer: ContainerOverlay = field(
        doc="Additions to the trainer container.", default_factory=lambda: ContainerOverlay()
    )
    fill: ContainerOverlay = field(
        doc="Additions to the fill-executor sidecar.", default_factory=lambda: ContainerOverlay()
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="!has(self.hostPortBase) || (has(self.hostNetwork) && self.hostNetwork)",
            message="spec.podTemplate.hostPortBase applies to host-network pods only (on the pod network each pod "
            "has its own ports); set hostNetwork: true or remove hostPortBase",
            field_path=".hostPortBase",
        ),
    )
