"""The operator's Kubernetes client: the official ``kubernetes`` client, called from a bounded thread pool.

The operator's writes are few kinds and plain JSON, so a table of resources and six verbs is all it needs. Every
request goes through the official client's :class:`~kubernetes.client.ApiClient` the way its own ``DynamicClient``
sends one (``param_serialize`` + ``call_api``): credentials from its loaders (a kubeconfig, or the in-cluster
ServiceAccount token, refreshed before it expires), its TLS set-up, connection pool, JSON encoding and query quoting.
Answers stay plain dicts (the typed APIs would turn every pod into model objects the operator turns back into dicts).
The client is synchronous, so each request runs in a thread of a pool as large as the connection pool: at most
``connections`` requests are in flight, the rest wait their turn without blocking kopf's event loop. Every call is
timed, so the reconcile can tell its own time from the time it waits on the API server.

A watch holds its connection for minutes, so it does not take a thread: :meth:`Kube.watch` streams it with aiohttp
(kopf's own HTTP client) on the event loop, with the same server, CA, client certificate and token.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

__all__ = ["RESOURCES", "ApiError", "Kube", "Resource", "load_configuration", "resource_of"]

USER_AGENT = "pipefill-operator (kubernetes-python)"


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
    Resource("pipefill.io/v1alpha1", "FillJob", "filljobs"),
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


class ApiError(ApiException):
    """A failed request: ``status`` (409, 404, ...), the Status ``reason`` (``AlreadyExists``, ``Conflict``, ...) and
    ``message``; status 0 when no answer came (connection refused, timed out, TLS), with the transport error's name
    as ``reason``. An :class:`~kubernetes.client.exceptions.ApiException`, so code written for the official client
    catches it too."""

    def __init__(self, status: int, reason: str, message: str, *, method: str, path: str) -> None:
        super().__init__(status=status, reason=reason)
        self.status: int = status
        self.reason: str = reason
        self.message = message
        self.text = f"{method} {path}: {status} {reason}: {message}"

    def __str__(self) -> str:
        return self.text


def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """Credentials from ``kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``, else the in-cluster token."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if kubeconfig or Path(path).exists():
        config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return cfg


def _error(status: int, data: bytes, http_reason: str, method: str, path: str) -> ApiError:
    """The API server's Status object as an :class:`ApiError` (its reason, e.g. AlreadyExists, not the HTTP one)."""
    text = data.decode("utf-8", "replace")
    try:
        payload = json.loads(text) if text else {}
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    reason = str(payload.get("reason") or http_reason)
    return ApiError(status, reason, str(payload.get("message") or text[:500]), method=method, path=path)


class Kube:
    """One :class:`~kubernetes.client.ApiClient` and the threads that call it; ``api_wait_s`` accumulates the time
    spent waiting on the API server (a request's turn for a thread included)."""

    def __init__(self, cfg: client.Configuration, *, timeout_s: float = 30.0, connections: int = 32) -> None:
        self.cfg = cfg
        self.server = str(cfg.host).rstrip("/")
        cfg.connection_pool_maxsize = connections  # one connection per thread: none opened and thrown away
        self._api = client.ApiClient(cfg)
        self._api.user_agent = USER_AGENT
        self._timeout_s = timeout_s
        self._connections = connections
        self._executor: ThreadPoolExecutor | None = None
        self.api_wait_s = 0.0
        self.requests = 0
        # called with (HTTP method, seconds) after every request: the operator's metrics time the API server
        self.on_request: Callable[[str, float], None] | None = None
        self._streams: aiohttp.ClientSession | None = None  # watches (see watch)

    def authorization(self) -> str | None:
        """The Authorization header's value (``Bearer …``); the loader's hook refreshes an expiring token."""
        for key in ("BearerToken", "authorization"):
            value = self.cfg.get_api_key_with_prefix(key)
            if value:
                return str(value)
        return None

    async def close(self) -> None:
        """Let the pool's threads end and close the connections; a later request starts them again."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self._api.rest_client.close()
        if self._streams is not None:
            await self._streams.close()
            self._streams = None

    def _stream_session(self) -> aiohttp.ClientSession:
        if self._streams is None:
            context: ssl.SSLContext | bool = False
            if self.server.startswith("https"):
                context = ssl.create_default_context(cafile=self.cfg.ssl_ca_cert or None)
                if not self.cfg.verify_ssl:
                    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                if self.cfg.cert_file:
                    context.load_cert_chain(self.cfg.cert_file, self.cfg.key_file or None)
            # an event is a whole object on one line: room for the largest (a ConfigMap holds up to 1 MiB)
            self._streams = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context), read_bufsize=2**23)
        return self._streams

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        resource_version: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events (``{"type", "object"}``) of ``res`` from ``resource_version`` until the server ends the
        watch (after about ``timeout_s``); an error answer, a 410 Gone included, raises :class:`ApiError`."""
        path = res.path(namespace)
        params = {"watch": "1", "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "false"}
        if field_selector:
            params["fieldSelector"] = field_selector
        if resource_version:
            params["resourceVersion"] = resource_version
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if auth := self.authorization():
            headers["Authorization"] = auth
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout_s, sock_read=timeout_s + self._timeout_s)
        try:
            async with self._stream_session().get(
                self.server + path, params=params, headers=headers, timeout=timeout
            ) as response:
                if response.status >= 400:
                    raise _error(response.status, await response.read(), str(response.reason), "WATCH", path)
                async for line in response.content:
                    if not line.strip():
                        continue
                    event: dict[str, Any] = json.loads(line)
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: the version is too old to watch from
                        obj = event.get("object") or {}
                        raise ApiError(
                            int(obj.get("code") or 500),
                            str(obj.get("reason") or "Error"),
                            str(obj.get("message") or ""),
                            method="WATCH",
                            path=path,
                        )
                    yield event
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc), method="WATCH", path=path) from exc

    def _send(
        self, method: str, path: str, params: dict[str, str] | None, body: Any, content_type: str
    ) -> dict[str, Any]:
        """One request, in a pool thread: the decoded answer, or :class:`ApiError`."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            request = self._api.param_serialize(
                method,
                path,
                query_params=list(params.items()) if params else None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*request, _request_timeout=self._timeout_s)
            data: bytes = response.read()  # type: ignore[no-untyped-call]
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:  # no answer: refused, timed out, TLS
            raise ApiError(0, type(exc).__name__, str(exc), method=method, path=path) from exc
        if response.status >= 400:
            raise _error(response.status, data, str(response.reason), method, path)
        payload: dict[str, Any] = json.loads(data) if data else {}
        return payload

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._connections, thread_name_prefix="kube")
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            return await loop.run_in_executor(self._executor, self._send, method, path, params, body, content_type)
        finally:
            waited_s = time.perf_counter() - started
            self.api_wait_s += waited_s
            self.requests += 1
            if self.on_request is not None:
                self.on_request(method, waited_s)

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

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, *, uid: str | None = None
    ) -> dict[str, Any] | None:
        """Delete (in the background); a uid precondition never deletes a newer object of the same name. The API
        server's answer (the object marked for deletion, or a Status), None when it was gone already."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            return await self.request("DELETE", res.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone already, or a newer object holds the name
                raise
            return None

    async def merge_patch(
        self, res: Resource, name: str, patch: dict[str, Any], namespace: str | None = None, *, sub: str | None = None
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH", res.path(namespace, name, sub), body=patch, content_type="application/merge-patch+json"
        )
