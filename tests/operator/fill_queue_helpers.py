"""Helpers of the fill queue's cluster tests: FillJobs, the test playing the executors (status patches with a
resourceVersion precondition, as the executor's merge does), and waits on FillJob status."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException
from operator_harness import GROUP, VERSION, Kube, OperatorProcess

FILL_PLURAL = "filljobs"

FILL: dict[str, Any] = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "FillJob",
    "metadata": {"name": "embed"},
    "spec": {
        "workload": {"kind": "inference", "builtin": "encoder-inference"},
        "output": {"path": "out"},
        "totalSamples": 1024,
    },
}


def fill_manifest(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    obj = copy.deepcopy(FILL)
    obj["metadata"]["name"] = name
    if labels:
        obj["metadata"]["labels"] = labels
    obj["spec"].update(copy.deepcopy(spec))
    return obj


class Fill:
    """FillJobs through the test's admin client."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.custom = kube.custom

    def create(self, obj: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, FILL_PLURAL, obj)

    def get(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, FILL_PLURAL, name
        )
        return got

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, FILL_PLURAL, name, {"spec": spec})

    def wait(self, name: str, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 60) -> dict[str, Any]:
        def check(items: list[dict[str, Any]]) -> dict[str, Any] | None:
            return next((i for i in items if predicate(i)), None)

        found: dict[str, Any] = self.kube._watch(
            self.custom.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, FILL_PLURAL), check,
            timeout_s, f"FillJob {name}", field_selector=f"metadata.name={name}",
        )  # fmt: skip
        return found

    def executor_patch(self, name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Play an executor: read the status, change it, write it back under the read's resourceVersion (409: read
        and change again), as the executor's status merge does."""
        for _ in range(20):
            obj = self.get(name)
            status = copy.deepcopy(obj.get("status") or {})
            change(status)
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": status}
            try:
                out: dict[str, Any] = self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, self.namespace, FILL_PLURAL, name, patch
                )
                return out
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise AssertionError(f"FillJob {name}: 20 conflicts in a row")

    def commit(self, name: str, start: int, committed: int) -> dict[str, Any]:
        """Advance the commit pointer of the slice starting at ``start`` (never backwards)."""

        def change(status: dict[str, Any]) -> None:
            for s in status["slices"]:
                if s["start"] == start:
                    s["committed"] = max(s["committed"], committed)

        return self.executor_patch(name, change)


def status(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = obj.get("status") or {}
    return out


def scheduled(obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in status(obj).get("conditions") or () if c["type"] == "Scheduled"), {})
    return found


def assigned(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: len(status(obj).get("assignments") or ()) == count


def start_queue_operator(
    kubeconfig: Path, log: Path, namespace: str, *, args: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> OperatorProcess:
    proc = OperatorProcess(kubeconfig, log, namespaces=(namespace,), args=args, env=env)
    proc.start()
    return proc
