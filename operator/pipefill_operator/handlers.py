"""kopf's part: log in, watch the job kind, its pods, FillJobs, ConfigMaps, PersistentVolumeClaims and nodes, and
route every event to a job key (and the fill queue's index).

Only watching handlers (``kopf.on.event``) are used: they keep no progress in annotations and add no finalizer, so
deleting a job never waits for the operator and leaves nothing behind (the children go by garbage collection).
Handlers are registered into a registry passed in, so a test or a second operator builds its own.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf

from pipefill.children import JOB_LABEL
from pipefill_operator.controller import Controller

__all__ = ["configure", "register"]

log = logging.getLogger("pipefill_operator")


def configure(settings: kopf.OperatorSettings, *, clusterwide: bool) -> None:
    """What the operator needs from kopf, and nothing it does not (fewer API calls, fewer RBAC verbs)."""
    settings.peering.standalone = True  # one operator; leader election belongs to the Deployment (replicas: 1)
    settings.scanning.disabled = True  # no CRD or namespace watches: the kinds are known, namespaces are given
    settings.posting.reporting_component = "pipefill-operator"
    settings.posting.level = logging.WARNING  # the Events are the operator's own; kopf posts only its warnings
    settings.watching.label_selectors[("v1", "pods")] = JOB_LABEL  # only rank pods, filtered by the API server
    del clusterwide  # the node watch is registered only cluster-wide (register)


def _key(body: Any) -> tuple[str, str]:
    meta = body["metadata"]
    return str(meta.get("namespace", "")), str(meta["name"])


def register(controller: Controller, registry: kopf.OperatorRegistry) -> None:
    """Register the handlers of ``controller`` into ``registry``."""
    cfg = controller.kube.cfg

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        header = controller.kube.authorization() or ""
        scheme, _space, token = header.partition(" ")
        return kopf.ConnectionInfo(
            server=str(cfg.host),
            ca_path=cfg.ssl_ca_cert or None,
            insecure=not cfg.verify_ssl,
            certificate_path=cfg.cert_file or None,
            private_key_path=cfg.key_file or None,
            scheme=scheme.capitalize() if scheme else None,
            token=token or None,
        )

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, clusterwide=controller.config.clusterwide)
        await controller.start()
        where = ", ".join(controller.config.namespaces) or "all namespaces"
        log.info("pipefill operator ready: serving %s on %s", where, controller.kube.server)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await controller.stop()

    fill = controller.fill

    @kopf.on.event("pipefill.io", "v1alpha1", "pipelinetrainingjobs", registry=registry)
    def job_event(type: str | None, body: Any, **_: Any) -> None:
        copied = copy.deepcopy(dict(body))
        if type == "DELETED":
            controller.job_deleted(_key(body), body["metadata"].get("uid"))
        else:
            controller.job_changed(_key(body), copied)
        if fill is not None:
            fill.training_job_event(copied, deleted=type == "DELETED")

    @kopf.on.event("v1", "pods", labels={JOB_LABEL: kopf.PRESENT}, registry=registry)
    def pod_event(type: str | None, body: Any, **_: Any) -> None:
        controller.enqueue((str(body["metadata"]["namespace"]), str(body["metadata"]["labels"][JOB_LABEL])))
        if fill is not None:
            fill.pod_event(copy.deepcopy(dict(body)), deleted=type == "DELETED")

    if fill is not None:

        @kopf.on.event("pipefill.io", "v1alpha1", "filljobs", registry=registry)
        def fill_job_event(type: str | None, body: Any, **_: Any) -> None:
            fill.fill_job_event(copy.deepcopy(dict(body)), deleted=type == "DELETED")

    @kopf.on.event("v1", "configmaps", registry=registry)
    def config_map_event(body: Any, **_: Any) -> None:
        controller.object_changed("ConfigMap", *_key(body))

    @kopf.on.event("v1", "persistentvolumeclaims", registry=registry)
    def claim_event(body: Any, **_: Any) -> None:
        controller.object_changed("PersistentVolumeClaim", *_key(body))

    if controller.config.clusterwide:

        @kopf.on.event("v1", "nodes", registry=registry)
        def node_event(type: str | None, body: Any, **_: Any) -> None:
            controller.node_changed(dict(body), deleted=type == "DELETED")
