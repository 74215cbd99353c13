"""Merge ``spec.podTemplate`` into a rank pod: the user's additions, never a replacement of what the operator sets.

A collision (a label, annotation, volume, mount path, environment variable or resource the pod already has) is an
error naming the field, the value and the fix: silently letting either side win would break the pod contract (an
``env`` entry overriding ``RANK``) or the user's intent. Conflicts are found against the pod itself, so a new
operator-set field is protected without a list to keep in sync. The API server checks the free-form parts
(affinity, volume sources) when the pod is created.
"""

from __future__ import annotations

from typing import Any

from pipefill.spec import PodTemplate, to_obj
from pipefill.spec.podtemplate import ContainerOverlay
from pipefill.spec.validation import FieldError

__all__ = ["OverlayError", "apply_overlay", "overlay_problems"]

_FIELD = "spec.podTemplate"
_CONTAINERS = {"trainer": "trainer", "fill": "fill-executor"}
_RESERVED_PREFIXES = ("pipefill.io/",)
_RESERVED_ENV_PREFIX = "PIPEFILL_"
_UNMOUNTABLE = ("/", "/workspace")


class OverlayError(ValueError):
    """``spec.podTemplate`` collides with the rank pod; ``errors`` names each collision."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def _map_problems(kind: str, extra: dict[str, str], have: dict[str, str]) -> list[FieldError]:
    out = []
    for key in extra:
        path = f"{_FIELD}.{kind}[{key!r}]"
        if key.startswith(_RESERVED_PREFIXES) or key in have:
            out.append(
                FieldError(path, f"{path}: Invalid value: {key!r}: the operator sets this {kind[:-1]}; use another key")
            )
    return out


def _container_problems(
    which: str, extra: ContainerOverlay, container: dict[str, Any] | None, own: set[str]
) -> list[FieldError]:
    base = f"{_FIELD}.{which}"
    nonempty = extra.env or extra.env_from or extra.volume_mounts or extra.resources.requests or extra.resources.limits
    if container is None:
        if nonempty:
            return [
                FieldError(
                    base,
                    f"{base}: Forbidden: this pod has no {_CONTAINERS[which]} container (spec.fill.enabled is false); remove {base}",
                )
            ]
        return []
    out: list[FieldError] = []
    env_names = {e["name"] for e in container["env"]}
    for i, var in enumerate(extra.env):
        path = f"{base}.env[{i}].name"
        if var.name in env_names or var.name.startswith(_RESERVED_ENV_PREFIX):
            out.append(
                FieldError(
                    path,
                    f"{path}: Invalid value: {var.name!r}: the operator sets this variable (the pod contract, docs/operator.md); use another name",
                )
            )
    paths = {m["mountPath"] for m in container["volumeMounts"]}
    for i, mount in enumerate(extra.volume_mounts):
        path = f"{base}.volumeMounts[{i}]"
        if mount.name not in own:
            known = ", ".join(sorted(own)) or "none"
            out.append(
                FieldError(
                    f"{path}.name",
                    f"{path}.name: Not found: {mount.name!r}: mount a volume of {_FIELD}.volumes (declared: {known})",
                )
            )
        if mount.mount_path.rstrip("/") in paths or (mount.mount_path.rstrip("/") or "/") in _UNMOUNTABLE:
            out.append(
                FieldError(
                    f"{path}.mountPath",
                    f"{path}.mountPath: Invalid value: {mount.mount_path!r}: the operator mounts this path; choose another",
                )
            )
    for kind in ("requests", "limits"):
        have = container["resources"].get(kind, {})
        for name in getattr(extra.resources, kind):
            if name in have:
                path = f"{base}.resources.{kind}[{name!r}]"
                out.append(
                    FieldError(
                        path, f"{path}: Invalid value: {name!r}: set by spec.resources or spec.fill; change it there"
                    )
                )
    return out


def overlay_problems(pod: dict[str, Any], overlay: PodTemplate) -> list[FieldError]:
    """Every collision of ``overlay`` with ``pod`` (empty when it merges cleanly)."""
    meta, spec = pod["metadata"], pod["spec"]
    out = _map_problems("labels", overlay.labels, meta.get("labels", {}))
    out += _map_problems("annotations", overlay.annotations, meta.get("annotations", {}))
    ours = {v["name"] for v in spec.get("volumes", [])}
    own = {v.name for v in overlay.volumes}
    for i, volume in enumerate(overlay.volumes):
        if volume.name in ours:
            path = f"{_FIELD}.volumes[{i}].name"
            out.append(
                FieldError(
                    path, f"{path}: Invalid value: {volume.name!r}: the operator names a volume so; use another name"
                )
            )
    containers = _containers(pod)
    for which, name in _CONTAINERS.items():
        out += _container_problems(which, getattr(overlay, which), containers.get(name), own)
    return out


def _merge_container(container: dict[str, Any], extra: ContainerOverlay) -> None:
    container["env"].extend(to_obj(v) for v in extra.env)
    if extra.env_from:
        container["envFrom"] = [to_obj(e) for e in extra.env_from]
    container["volumeMounts"].extend(to_obj(m) for m in extra.volume_mounts)
    for kind in ("requests", "limits"):
        more = {k: str(v) for k, v in getattr(extra.resources, kind).items()}
        if more:
            container["resources"].setdefault(kind, {}).update(more)


def apply_overlay(pod: dict[str, Any], overlay: PodTemplate) -> None:
    """Merge ``overlay`` into ``pod`` in place; :class:`OverlayError` on any collision."""
    problems = overlay_problems(pod, overlay)
    if problems:
        raise OverlayError(problems)
    meta, spec = pod["metadata"], pod["spec"]
    if overlay.labels:
        meta["labels"] = {**meta.get("labels", {}), **overlay.labels}
    if overlay.annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **overlay.annotations}
    if overlay.node_selector:
        spec["nodeSelector"] = dict(overlay.node_selector)
    if overlay.tolerations:
        spec["tolerations"] = [to_obj(t) for t in overlay.tolerations]
    if overlay.affinity:
        spec["affinity"] = overlay.affinity
    if overlay.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in overlay.image_pull_secrets]
    spec["volumes"].extend(to_obj(v) for v in overlay.volumes)
    if overlay.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"  # keep resolving <pod>.<job> through the cluster DNS
    if overlay.host_aliases:
        spec["hostAliases"] = [to_obj(a) for a in overlay.host_aliases]
    containers = _containers(pod)
    for which, name in _CONTAINERS.items():
        if name in containers:
            _merge_container(containers[name], getattr(overlay, which))
