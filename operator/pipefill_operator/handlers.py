"""kopf's part: log in, watch the job kind, its pods, FillJobs and nodes, and route every event to a job key (and
the cache the reconciles and the fill queue's pass read). The ConfigMaps and claims jobs wait for are watched one by
one, by name, while they are awaited (:mod:`pipefill_operator.awaited`), not all of the cluster's.

Only watching handlers (``kopf.on.event``) are used: they keep no progress in annotations and add no finalizer, so
deleting a job never waits for the operator and leaves nothing behind (the children go by garbage collection).
Every handler is ``async def``, so kopf runs it on the event loop, where everything it touches lives (the work
queue, the reconciler's memory, the node view, the cache): a plain ``def`` would run in kopf's thread pool and race
the loop on those. Handlers are registered into a registry passed in, so a test or a second operator builds its own;
:func:`register` returns them by name.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import kopf

from pipefill.children import JOB_LABEL
from pipefill_operator.controller import Controller

__all__ = ["WatchOnlyDiffBase", "configure", "register", "settle_heap"]

log = logging.getLogger("pipefill_operator")

# Startup is retried this often while its first lists fail (kopf's default: 60 s). They fail where the operator starts
# before it may list what it serves: CRDs applied with it and not served yet, its ClusterRole bound a moment later.
# A failed startup has started nothing (Controller.start lists before it starts a task), so a retry starts afresh.
STARTUP_RETRY_S = 3.0


class WatchOnlyDiffBase(kopf.DiffBaseStorage):
    """No "essence" of the objects: kopf builds one at every event (a deep copy of the whole body, then cleared of
    what its change detection ignores) to tell creations and updates apart for on.create/on.update handlers. This
    operator registers only watching handlers, which never read it: with kopf's default storage, those copies were
    half of the operator's CPU while 1 200 rank pods started."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


def configure(settings: kopf.OperatorSettings, *, clusterwide: bool) -> None:
    """What the operator needs from kopf, and nothing it does not (fewer API calls, fewer RBAC verbs)."""
    settings.peering.standalone = True  # one operator; leader election belongs to the Deployment (replicas: 1)
    settings.scanning.disabled = True  # no CRD or namespace watches: the kinds are known, namespaces are given
    settings.posting.reporting_component = "pipefill-operator"
    settings.posting.level = logging.WARNING  # the Events are the operator's own; kopf posts only its warnings
    settings.persistence.diffbase_storage = WatchOnlyDiffBase()
    # kopf's own first list (and its list after a 410) in pages: a restart among 8 000 rank pods never holds them
    # all, as one parsed answer, at once
    settings.watching.chunk_size = 500
    settings.watching.label_selectors[("v1", "pods")] = JOB_LABEL  # only rank pods, filtered by the API server
    del clusterwide  # the node watch is registered only cluster-wide (register)


def settle_heap() -> None:
    """Keep Python's cycle collector off the long-lived heap. What exists once the operator has started (every
    module, kopf's and the official client's included, and the first list of pods and jobs) is moved out of its
    reach (``gc.freeze``), and full collections run a tenth as often. Nearly all the operator's garbage is acyclic,
    freed by reference counting; with the defaults, full collections of the whole heap took 40 % of the event
    loop's CPU while 2 400 rank pods started (52 collections of 150 ms)."""
    gc.freeze()
    young, middle, _old = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


def _key(body: Any) -> tuple[str, str]:
    meta = body["metadata"]
    return str(meta.get("namespace", "")), str(meta["name"])


def register(controller: Controller, registry: kopf.OperatorRegistry) -> dict[str, Callable[..., Any]]:
    """Register the handlers of ``controller`` into ``registry``; the watching handlers by name."""
    cfg = controller.kube.cfg
    cache = controller.cache

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

    @kopf.on.startup(registry=registry, backoff=STARTUP_RETRY_S)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, clusterwide=controller.config.clusterwide)
        await controller.start()
        settle_heap()
        where = ", ".join(controller.config.namespaces) or "all namespaces"
        log.info("pipefill operator ready: serving %s on %s", where, controller.kube.server)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await controller.stop()

    fill = controller.fill
    handlers: dict[str, Callable[..., Any]] = {}

    @kopf.on.event("pipefill.io", "v1alpha1", "pipelinetrainingjobs", registry=registry)
    async def job_event(type: str | None, body: Any, **_: Any) -> None:
        job, changed = cache.event("training_jobs", type, body)
        if type == "DELETED":
            controller.job_deleted(_key(job), job["metadata"].get("uid"))
        else:
            controller.job_changed(_key(job), job)
        if fill is not None and changed:
            fill.wake()

    @kopf.on.event("v1", "pods", labels={JOB_LABEL: kopf.PRESENT}, registry=registry)
    async def pod_event(type: str | None, body: Any, **_: Any) -> None:
        pod, changed = cache.event("pods", type, body)
        controller.pod_changed((str(pod["metadata"]["namespace"]), str(pod["metadata"]["labels"][JOB_LABEL])))
        if fill is not None and changed:
            fill.wake()

    handlers.update(job_event=job_event, pod_event=pod_event)
    if fill is not None:

        @kopf.on.event("pipefill.io", "v1alpha1", "filljobs", registry=registry)
        async def fill_job_event(type: str | None, body: Any, **_: Any) -> None:
            if cache.event("fill_jobs", type, body)[1]:
                fill.wake()

        handlers["fill_job_event"] = fill_job_event

    if controller.config.clusterwide:

        @kopf.on.event("v1", "nodes", registry=registry)
        async def node_event(type: str | None, body: Any, **_: Any) -> None:
            controller.node_changed(body, deleted=type == "DELETED")

        handlers["node_event"] = node_event
    return handlers
