"""A small asynchronous client of the Kubernetes REST API, on aiohttp (which kopf already runs on).

The operator's writes are few kinds and plain JSON, so a table of resources and six verbs is all it needs; the
credentials come from the official client's loaders (a kubeconfig, or the in-cluster ServiceAccount token, refreshed
before it expires), so the operator authenticates exactly as ``kubectl`` would. Every call is timed, so the
reconcile can tell its own time from the time it waits on the API server.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client, config

__all__ = ["RESOURCES", "ApiError", "Kube", "Resource", "load_configuration", "resource_of"]


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API: ``api_version`` (``v1`` or ``group/version``), ``plural``, namespaced or not."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            root += f"/namespaces/{namespace}"
        root += f"/{self.plural}"
        if name is not None:
            root += f"/{name}"
        if sub is not None:
            root += f"/{sub}"
        return root


RESOURCES: tuple[Resource, ...] = (
    Resource("pipefill.io/v1alpha1", "PipelineTrainingJob", "pipelinetrainingjobs"),
    Resource("v1", "Pod", "pods"),
    Resource("v1", "Service", "services"),
    Resource("v1", "ConfigMap", "configmaps"),
    Resource("v1", "ServiceAccount", "serviceaccounts"),
    Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    Resource("v1", "Event", "events"),
    Resource("v1", "Node", "nodes", namespaced=False),
    Resource("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Resource("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates"),
    Resource("resource.k8s.io/v1", "DeviceClass", "deviceclasses", namespaced=False),
    Resource("scheduling.k8s.io/v1alpha2", "PodGroup", "podgroups"),
    Resource("scheduling.volcano.sh/v1beta1", "PodGroup", "podgroups"),
    Resource("scheduling.x-k8s.io/v1alpha1", "PodGroup", "podgroups"),
)
_BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}


def resource_of(api_version: str, kind: str) -> Resource:
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not manage {kind} of {api_version}") from None


class ApiError(Exception):
    """A non-2xx answer: ``status`` (409, 404, ...), the Status ``reason`` and ``message``."""

    def __init__(self, status: int, reason: str, message: str, *, method: str, path: str) -> None:
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{method} {path}: {status} {reason}: {message}")


def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """Credentials from ``kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``, else the in-cluster token."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if kubeconfig or Path(path).exists():
        config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return cfg


class Kube:
    """One aiohttp session to the API server; ``api_wait_s`` accumulates the time spent waiting on it."""

    def __init__(self, cfg: client.Configuration, *, timeout_s: float = 30.0, connections: int = 64) -> None:
        self.cfg = cfg
        self.server = str(cfg.host).rstrip("/")
        context = (
            ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        )
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        self._ssl = context
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self.api_wait_s = 0.0
        self.requests = 0
        # called with (HTTP method, seconds) after every request: the operator's metrics time the API server
        self.on_request: Callable[[str, float], None] | None = None

    def authorization(self) -> str | None:
        """The Authorization header's value (``Bearer …``); the loader's hook refreshes an expiring token."""
        for key in ("BearerToken", "authorization"):
            value = self.cfg.get_api_key_with_prefix(key)
            if value:
                return str(value)
        return None

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        token = self.authorization()
        if token:
            headers["Authorization"] = token
        return headers

    async def _session_(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self._connections)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        session = await self._session_()
        data = None if body is None else json.dumps(body)
        started = time.perf_counter()
        try:
            async with session.request(
                method, self.server + path, params=params, data=data, headers=self._headers(content_type)
            ) as response:
                text = await response.text()
        finally:
            waited_s = time.perf_counter() - started
            self.api_wait_s += waited_s
            self.requests += 1
            if self.on_request is not None:
                self.on_request(method, waited_s)
        payload: dict[str, Any] = json.loads(text) if text else {}
        if response.status >= 400:
            raise ApiError(
                response.status,
                str(payload.get("reason") or response.reason),
                str(payload.get("message") or text[:500]),
                method=method,
                path=path,
            )
        return payload

    # -- verbs ---------------------------------------------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", res.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self, res: Resource, namespace: str | None = None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[dict[str, Any]] = (await self.request("GET", res.path(namespace), params=params)).get("items", [])
        return items

    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create ``obj``; None when an object of that name exists already (creates are idempotent by name)."""
        res = resource_of(obj["apiVersion"], obj["kind"])
        try:
            return await self.request("POST", res.path(obj["metadata"].get("namespace")), body=obj)
        except ApiError as exc:
            if exc.status == 409 and exc.reason == "AlreadyExists":
                return None
            raise

    async def delete(self, res: Resource, name: str, namespace: str | None = None, *, uid: str | None = None) -> None:
        """Delete (in the background); a uid precondition never deletes a newer object of the same name."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", res.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone already, or a newer object holds the name
                raise

    async def merge_patch(
        self, res: Resource, name: str, patch: dict[str, Any], namespace: str | None = None, *, sub: str | None = None
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH", res.path(namespace, name, sub), body=patch, content_type="application/merge-patch+json"
        )
