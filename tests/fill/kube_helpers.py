"""Helpers of the fill executor's cluster tests: FillJobs on the real API server, their status written as the operator
writes it, and a ServiceAccount with exactly the fill executor's RBAC (pipefill.children.FILL_RULES)."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from pipefill.children import FILL_RULES
from pipefill.devcluster import ControlPlane
from pipefill.queue import plan_slices
from pipefill.spec import GROUP, VERSION

PLURAL = "filljobs"


def admin(cp: ControlPlane) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(cp.kubeconfig)))


def executor_account(cp: ControlPlane, namespace: str, name: str = "fill") -> Path:
    """A ServiceAccount bound to the fill executor's Role; returns a kubeconfig authenticating as it."""
    meta = {"name": name, "namespace": namespace}
    cp.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": FILL_RULES},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ]
    )
    return cp.kubeconfig_for(namespace, name)


def api_as(kubeconfig: Path) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))


MIN_SLICE = 64
"""The FillJobs' spec.minSliceSamples here."""


def create_filljob(
    api: client.CustomObjectsApi,
    namespace: str,
    name: str,
    *,
    output: str,
    total: int = 256,
    ranks: int = 2,
    parameters: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FillJob",
        "metadata": {"name": name},
        "spec": {
            "workload": {
                "kind": "inference",
                "builtin": "encoder-inference",
                "parameters": parameters or {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16},
            },
            "output": {"path": output},
            "totalSamples": total,
            "maxParallelRanks": ranks,
            "minSliceSamples": MIN_SLICE,  # small jobs, several slices: the slicing is what these tests exercise
            **spec,
        },
    }
    return cast(dict[str, Any], api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body))


def write_status(
    api: client.CustomObjectsApi, namespace: str, name: str, edit: Callable[[dict[str, Any]], None]
) -> None:
    """Read the status, let ``edit`` change it, write it back with the resourceVersion precondition (409: again),
    as the operator does."""
    for _ in range(20):
        obj = cast(dict[str, Any], api.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name))
        status = obj.get("status") or {}
        edit(status)
        obj["status"] = status  # obj carries the resourceVersion read: a replace that raced another write gets 409
        try:
            api.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, obj)
            return
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError(f"FillJob {name}: 20 conflicts in a row")


def plan(status: dict[str, Any], total: int, ranks: int) -> None:
    """The operator's plan of record (written once)."""
    status.setdefault(
        "slices",
        [
            {"start": s.start, "end": s.end, "committed": s.start}
            for s in plan_slices(total, parallel_ranks=ranks, min_units=MIN_SLICE)
        ],
    )


def assign(status: dict[str, Any], *, start: int, end: int, pod: str, uid: str, job: str = "gpt", rank: int = 0) -> int:
    """Assign [start, end) to a pod at the next epoch (replacing the slice's previous assignment); returns the epoch."""
    epoch = int(status.get("epoch") or 0) + 1
    kept = [a for a in status.get("assignments") or [] if (a["start"], a["end"]) != (start, end)]
    entry = {"trainingJob": job, "rank": rank, "start": start, "end": end, "pod": pod, "podUID": uid, "epoch": epoch}
    status["assignments"] = [*kept, entry]
    status["epoch"] = epoch
    status.setdefault("phase", "Running")
    return epoch


def get_status(api: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    obj = cast(dict[str, Any], api.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name))
    return cast(dict[str, Any], obj.get("status") or {})


class PausableProxy:
    """A TCP proxy on loopback in front of the real API server, for an API server that stops answering: while
    paused it accepts connections and holds them without a byte (a hung server, as a client sees one); ``resume``
    drops the held ones (the client's retry connects again) and forwards every new connection."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.paused = threading.Event()
        self.held: list[socket.socket] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            if self.paused.is_set():
                self.held.append(conn)
                continue
            up = socket.create_connection(self.upstream)
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):  # the other direction's pump ends too, on its closed socket
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def pause(self) -> None:
        self.paused.set()

    def resume(self) -> None:
        self.paused.clear()
        for conn in self.held:
            conn.close()
        self.held.clear()

    def close(self) -> None:
        self.server.close()
        self.resume()


def api_through(kubeconfig: Path, proxy: PausableProxy) -> client.CustomObjectsApi:
    """A client of ``kubeconfig``'s identity whose requests go through ``proxy``: a copy of the kubeconfig naming the
    proxy as the server (the client reloads its kubeconfig before each request, so only the file can say so)."""
    doc = yaml.safe_load(kubeconfig.read_text())
    for cluster in doc["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    through = kubeconfig.with_name(f"{kubeconfig.stem}-via-{proxy.port}.yaml")
    through.write_text(yaml.safe_dump(doc))
    return api_as(through)


def upstream_of(kubeconfig: Path) -> tuple[str, int]:
    """(host, port) of the API server a kubeconfig names."""
    url = urllib.parse.urlsplit(config.new_client_from_config(str(kubeconfig)).configuration.host)
    return url.hostname or "127.0.0.1", url.port or 443
