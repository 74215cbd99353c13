"""The operator's client (pipefill_operator.kube, on the official kubernetes client) against the real API server:
each verb, and the meaning of each failure the reconcile relies on (404 → None, 409 AlreadyExists → None, a conflict
detectable, a refusal with its Status reason, no answer at all as status 0)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pipefill.devcluster import ControlPlane
from pipefill_operator.kube import ApiError, Kube, load_configuration, resource_of

pytestmark = pytest.mark.cluster

CONFIG_MAP = resource_of("v1", "ConfigMap")
T = TypeVar("T")


def _run(cp: ControlPlane, body: Callable[[Kube], Awaitable[T]], **kwargs: Any) -> T:
    async def main() -> T:
        kube = Kube(load_configuration(str(cp.kubeconfig)), **kwargs)
        try:
            return await body(kube)
        finally:
            await kube.close()

    return asyncio.run(main())


def _config_map(name: str, namespace: str, **data: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "labels": {"app": "kube-test"}}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_get_create_list_patch_delete(control_plane: ControlPlane, namespace: str) -> None:
    calls: list[str] = []

    async def body(kube: Kube) -> None:
        kube.on_request = lambda method, _s: calls.append(method)
        assert await kube.get(CONFIG_MAP, "cm", namespace) is None
        made = await kube.create(_config_map("cm", namespace, a="1"))
        assert made is not None and made["metadata"]["uid"] and made["data"] == {"a": "1"}
        assert await kube.create(_config_map("cm", namespace, a="2")) is None  # exists: idempotent by name
        assert [
            o["metadata"]["name"] for o in await kube.list(CONFIG_MAP, namespace, label_selector="app=kube-test")
        ] == ["cm"]
        assert await kube.list(CONFIG_MAP, namespace, label_selector="app=other") == []
        patched = await kube.merge_patch(CONFIG_MAP, "cm", {"data": {"b": "2"}}, namespace)
        assert patched["data"] == {"a": "1", "b": "2"}
        stale = {"metadata": {"resourceVersion": made["metadata"]["resourceVersion"]}, "data": {"c": "3"}}
        with pytest.raises(ApiError) as conflict:
            await kube.merge_patch(CONFIG_MAP, "cm", stale, namespace)
        assert (conflict.value.status, conflict.value.reason) == (409, "Conflict")
        assert isinstance(conflict.value, ApiException)  # code written for the official client catches it too
        await kube.delete(CONFIG_MAP, "cm", namespace, uid="00000000-0000-0000-0000-000000000000")  # not this one
        assert await kube.get(CONFIG_MAP, "cm", namespace) is not None
        await kube.delete(CONFIG_MAP, "cm", namespace, uid=made["metadata"]["uid"])
        assert await kube.get(CONFIG_MAP, "cm", namespace) is None
        await kube.delete(CONFIG_MAP, "cm", namespace)  # gone already: no error
        node = await kube.get(resource_of("v1", "Node"), "kwok-node-0")  # cluster-scoped
        assert node is not None and node["metadata"]["labels"]["type"] == "kwok"
        page = await kube.request("GET", resource_of("v1", "Node").path(), params={"limit": "1"})
        assert len(page["items"]) == 1 and page["metadata"].get("continue")
        assert kube.requests == len(calls) and kube.api_wait_s > 0

    _run(control_plane, body)
    assert calls[:3] == ["GET", "POST", "POST"] and "PATCH" in calls and "DELETE" in calls


def test_a_refusal_carries_the_status_reason_and_message(control_plane: ControlPlane, namespace: str) -> None:
    async def body(kube: Kube) -> ApiError:
        with pytest.raises(ApiError) as refused:
            await kube.create(_config_map("Not_A_Name", namespace))
        return refused.value

    error = _run(control_plane, body)
    assert (error.status, error.reason) == (422, "Invalid")
    assert "Not_A_Name" in error.message and "POST /api/v1/namespaces/" in str(error)


def test_a_forbidden_request_is_an_error_not_a_missing_object(control_plane: ControlPlane, namespace: str) -> None:
    client.CoreV1Api(
        client.ApiClient(load_configuration(str(control_plane.kubeconfig)))
    ).create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    kubeconfig = control_plane.kubeconfig_for(namespace, "nobody")

    async def main() -> ApiError:
        kube = Kube(load_configuration(str(kubeconfig)))
        try:
            with pytest.raises(ApiError) as denied:
                await kube.get(CONFIG_MAP, "anything", namespace)
            return denied.value
        finally:
            await kube.close()

    error = asyncio.run(main())
    assert (error.status, error.reason) == (403, "Forbidden")


def test_many_requests_at_once_share_a_bounded_pool(control_plane: ControlPlane, namespace: str) -> None:
    async def body(kube: Kube) -> list[dict[str, Any] | None]:
        made = await asyncio.gather(*(kube.create(_config_map(f"cm-{i}", namespace)) for i in range(40)))
        await kube.close()  # closed between requests: the next one starts the pool again
        listed = await kube.list(CONFIG_MAP, namespace, label_selector="app=kube-test")
        assert len(listed) == 40
        return made

    made = _run(control_plane, body, connections=4)
    assert all(m is not None for m in made)


def test_no_answer_is_an_api_error_with_status_0() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        cfg = client.Configuration(host=f"https://127.0.0.1:{port}")
        cfg.retries = 0

        async def main() -> ApiError:
            kube = Kube(cfg, timeout_s=5)
            try:
                with pytest.raises(ApiError) as failed:
                    await kube.get(CONFIG_MAP, "cm", "default")
                return failed.value
            finally:
                await kube.close()

        error = asyncio.run(main())
    assert (error.status, error.reason) == (0, "MaxRetryError") and "Connection refused" in error.message
