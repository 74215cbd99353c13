"""Helpers of the fill queue's cluster tests: FillJobs, the test playing the executors (status patches with a
resourceVersion precondition, as the executor's merge does), and waits on FillJob status."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException
from manifests import fill_job
from operator_harness import GROUP, VERSION, Kube, OperatorProcess
from urllib3.exceptions import ProtocolError

FILL_PLURAL = "filljobs"

# the output: a volume every rank pod mounts (a relative path is not split)
FILL: dict[str, Any] = fill_job("embed", output="/data/out", totalSamples=1024)


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


class Recorder:
    """Every watch event of a list call from now on, as (type, resourceVersion, object), in a thread: what the API
    server's history was, to compare the order of changes to different objects (one etcd: one revision order)."""

    def __init__(self, list_call: Callable[..., Any], *args: Any, **selectors: str) -> None:
        self.events: list[tuple[str, int, dict[str, Any]]] = []
        self._stopping = False
        self._changed = threading.Condition()
        listed = list_call(*args, **selectors)
        version = (
            listed["metadata"]["resourceVersion"] if isinstance(listed, dict) else listed.metadata.resource_version
        )
        self._watch = watch.Watch()
        self._thread = threading.Thread(
            target=self._run, args=(list_call, args, version, selectors), daemon=True, name="recorder"
        )
        self._thread.start()

    def _run(
        self, list_call: Callable[..., Any], args: tuple[Any, ...], version: str, selectors: dict[str, str]
    ) -> None:
        stream = self._watch.stream(list_call, *args, resource_version=version, timeout_seconds=120, **selectors)
        try:
            for event in stream:
                obj = event["raw_object"]
                with self._changed:
                    self.events.append((event["type"], int(obj["metadata"]["resourceVersion"]), obj))
                    self._changed.notify_all()
        except ProtocolError:
            if not self._stopping:  # stop() closes the stream under the reader; anything else is a failure
                raise

    def wait(self, predicate: Callable[[list[tuple[str, int, dict[str, Any]]]], bool], timeout_s: float = 60) -> None:
        """Until the events recorded so far satisfy ``predicate`` (woken by each event, no polling)."""
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.events), timeout=timeout_s), "recorder: timed out"

    def stop(self) -> list[tuple[str, int, dict[str, Any]]]:
        self._stopping = True
        self._watch.stop()
        self._thread.join(timeout=130)
        return list(self.events)
