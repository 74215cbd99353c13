"""Test helpers for the operator on the real control plane: the operator as its own process, under a ServiceAccount
bound to the committed ClusterRole (a missing verb is a 403 that fails the test), and the test playing the kubelet.

Waits are event-driven: a watch on the object (or on the job's pods) is checked at every event until the predicate
holds, never a sleep-and-poll loop.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from launched import Proc, popen
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from pipefill.devcluster import ControlPlane
from pipefill.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ROLE_FILE = ROOT / "operator" / "rbac" / "clusterrole.yaml"
OPERATOR_NAMESPACE = "pipefill-system"
GROUP, VERSION, PLURAL = "pipefill.io", "v1alpha1", "pipelinetrainingjobs"
READY_LINE = "pipefill operator ready"

JOB: dict[str, Any] = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "PipelineTrainingJob",
    "metadata": {"name": "train"},
    "spec": {
        "model": {"preset": "gpt-tiny"},
        "pipeline": {"stages": 2, "microbatches": 4, "globalBatch": 8},
        "resources": {"gpus": 1, "cpu": "1", "memory": "1Gi"},
        "gpuSharing": {"mode": "visibleDevices"},
        "fill": {"cpu": "100m", "memory": "256Mi"},
        "runPolicy": {"terminationGracePeriodSeconds": 5},
    },
}


def job_manifest(name: str = "train", **spec: Any) -> dict[str, Any]:
    """A small GPU job (2 ranks, 1 GPU each); ``spec`` entries replace the top-level spec fields given."""
    obj = copy.deepcopy(JOB)
    obj["metadata"]["name"] = name
    obj["spec"].update(copy.deepcopy(spec))
    return obj


def custom_pipeline(config_map: str) -> dict[str, Any]:
    """The ``pipeline`` of a 2-stage job of 4 microbatches whose schedule is the CSV in ConfigMap ``config_map``."""
    return {
        "stages": 2,
        "microbatches": 4,
        "globalBatch": 8,
        "schedule": "custom",
        "customSchedule": {"name": config_map},
    }


def install_identity(cp: ControlPlane, name: str, role: dict[str, Any] | None) -> Path:
    """A ServiceAccount ``pipefill-system/<name>`` bound to ``role`` (None: cluster-admin); its kubeconfig."""
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": OPERATOR_NAMESPACE}},
    ]
    role_name = "cluster-admin"
    if role is not None:
        role_name = f"{name}-role"
        objs.append({**role, "metadata": {**role["metadata"], "name": role_name}})
    objs.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": OPERATOR_NAMESPACE}],
        }
    )
    cp.apply(objs)
    return cp.kubeconfig_for(OPERATOR_NAMESPACE, name)


def committed_role() -> dict[str, Any]:
    role: dict[str, Any] = yaml.safe_load(ROLE_FILE.read_text())
    return role


# What ``python -m pipefill_operator`` imports first (1.5 of its 2.6 CPU seconds, 54 starts in the suite): each
# operator is forked from a launcher that imported them once (tests/launched.py), with no torch.
PRELOAD = (
    "kopf", "kubernetes", "prometheus_client", "pipefill_operator.cache", "pipefill_operator.controller",
    "pipefill_operator.fillqueue", "pipefill_operator.handlers", "pipefill_operator.kube", "pipefill_operator.metrics",
)  # fmt: skip


class OperatorProcess:
    """``python -m pipefill_operator`` as a child process, forked from a preloaded launcher; ``start`` returns once
    it serves."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *,
        namespaces: tuple[str, ...] = (),
        status_interval_s: float = 1.0,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig, self.log_path = kubeconfig, log_path
        self.namespaces, self.status_interval_s = namespaces, status_interval_s
        self.args, self.extra_env = args, env or {}
        self.metrics_port = free_port()
        self.proc: Proc | None = None

    def start(self, timeout_s: float = 60) -> None:
        argv = [sys.executable, "-m", "pipefill_operator", "--kubeconfig", str(self.kubeconfig)]
        argv += [
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
            "--status-interval",
            str(self.status_interval_s),
        ]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        argv += self.args
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | self.extra_env
        self.proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, preload=PRELOAD)
        ready = threading.Event()
        self._reader = threading.Thread(target=self._copy_log, args=(self.proc, ready), daemon=True)
        self._reader.start()
        if not ready.wait(timeout_s) or self.proc.poll() is not None:
            code = self._end(signal.SIGKILL)
            raise AssertionError(f"the operator did not start (exit {code}); see {self.log_path}")

    def _copy_log(self, proc: Proc, ready: threading.Event) -> None:
        """Copy the operator's output into its log file; set ``ready`` at the line saying it serves (or at exit)."""
        assert proc.stdout is not None
        with self.log_path.open("a") as log, proc.stdout:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if READY_LINE in line:
                    ready.set()
        ready.set()

    def _end(self, sig: int) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        self.proc = None
        return code

    def stop(self) -> int:
        return self._end(signal.SIGTERM)

    def kill(self) -> int:
        return self._end(signal.SIGKILL)

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                    return float(sample.value)
        return None

    def wait_metric(
        self, name: str, labels: dict[str, str] | None, ok: Callable[[float], bool], timeout_s: float = 30
    ) -> float:
        """The sample's value once ``ok`` holds for it (absent counts as 0). A metric has no watch: it is read every
        50 ms, the operator's own endpoint on loopback."""
        return wait_for(lambda: self.metric(name, labels) or 0.0, f"{name}{labels or ''}", timeout_s, until=ok)


class Kube:
    """The test's own API client (the admin): create jobs, wait on them, play the kubelet."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.api = config.new_client_from_config(str(cp.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def create_job(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        made: dict[str, Any] = self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, obj)
        return made

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return got

    def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def _watch(
        self,
        api_call: Callable[..., Any],
        args: tuple[Any, ...],
        check: Callable[[list[dict[str, Any]]], Any],
        timeout_s: float,
        what: str,
        since: dict[str, Any] | None = None,
        **selectors: str,
    ) -> Any:
        """List, check; then watch from that list's resourceVersion, checking after every event. ``check`` must
        depend on the objects alone: one that turns true between events (a file, a process) would wait for the
        watch's end, its whole timeout, so that fails here, naming it. ``since``: an object read earlier, instead of
        the list: the watch starts from its resourceVersion, so every change made since is checked in order, those
        over before this call included (a list shows only where they ended)."""
        deadline = time.monotonic() + timeout_s
        if since is None:
            listed = json.loads(api_call(*args, _preload_content=False, **selectors).data)
            items = {i["metadata"]["name"]: i for i in listed["items"]}
            version = listed["metadata"]["resourceVersion"]
        else:
            items, version = {since["metadata"]["name"]: since}, since["metadata"]["resourceVersion"]
        watched = False
        while True:
            found = check(list(items.values()))
            assert not (found and watched), f"{what}: true only once a watch ended; it depends on more than the objects"
            if found:
                return found
            watched = True
            left_s = deadline - time.monotonic()
            assert left_s > 0, f"timed out waiting for {what}; last seen: {[i.get('status') for i in items.values()]}"
            stream = watch.Watch().stream(
                api_call, *args, resource_version=version, timeout_seconds=max(1, int(left_s)), **selectors
            )
            for event in stream:
                obj = event["raw_object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] == "DELETED":
                    items.pop(obj["metadata"]["name"], None)
                else:
                    items[obj["metadata"]["name"]] = obj
                found = check(list(items.values()))
                if found:
                    return found
                if time.monotonic() > deadline:
                    break

    def wait_job(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout_s: float = 60,
        *,
        since: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Until the job satisfies ``predicate``; ``since``: the job as read earlier (see :meth:`_watch`)."""

        def check(items: list[dict[str, Any]]) -> dict[str, Any] | None:
            return next((i for i in items if predicate(i)), None)

        found: dict[str, Any] = self._watch(
            self.custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL), check, timeout_s,
            f"job {name}", since, field_selector=f"metadata.name={name}",
        )  # fmt: skip
        return found

    def wait_job_gone(self, namespace: str, name: str, timeout_s: float = 60) -> None:
        self._watch(
            self.custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL),
            lambda items: not items, timeout_s, f"job {name} gone", field_selector=f"metadata.name={name}",
        )  # fmt: skip

    def wait_pods(
        self, namespace: str, job: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 60
    ) -> list[dict[str, Any]]:
        """Wait until the job's pods (by label) satisfy ``predicate``; returns them."""

        return self._watch_list(
            self.core.list_namespaced_pod, namespace, lambda pods: pods if predicate(pods) else None, timeout_s,
            f"pods of {job}", label_selector=f"pipefill.io/job-name={job}",
        )  # fmt: skip

    def wait_events(
        self, namespace: str, reasons: set[str], kind: str = "PipelineTrainingJob", timeout_s: float = 60
    ) -> list[dict[str, Any]]:
        """Until an Event of each of ``reasons`` is on an object of ``kind``; returns those Events. The operator
        posts an Event after the status it tells of, so a test that saw the status waits for the Event too."""

        def pick(items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            found = [e for e in items if e.get("reason") in reasons]
            return found if reasons <= {e["reason"] for e in found} else None

        return self._watch_list(
            self.core.list_namespaced_event, namespace, pick, timeout_s, f"events {sorted(reasons)}",
            field_selector=f"involvedObject.kind={kind}",
        )  # fmt: skip

    def _watch_list(
        self,
        api_call: Callable[..., Any],
        namespace: str,
        pick: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None],
        timeout_s: float,
        what: str,
        **selectors: str,
    ) -> list[dict[str, Any]]:
        """``_watch`` of a namespace's list until ``pick`` returns a list (None: not yet), which may be empty."""

        def check(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]]] | None:
            got = pick(items)
            return None if got is None else (got,)  # a tuple: an empty list is a match too

        (result,) = self._watch(api_call, (namespace,), check, timeout_s, what, **selectors)
        return result

    def wait_gone(
        self, list_call: Callable[..., Any], namespace: str, what: str, timeout_s: float = 60, **sel: str
    ) -> None:
        """Wait until ``list_call(namespace, **sel)`` lists nothing."""
        self._watch(list_call, (namespace,), lambda items: not items, timeout_s, what, **sel)

    def end_trainer(self, namespace: str, pod: str, exit_code: int, message: str = "") -> None:
        """Play the kubelet: the trainer container of ``pod`` terminated with ``exit_code``; the pod is done."""
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        if message:
            terminated["message"] = message
        status = {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [
                {"name": "trainer", "image": "trainer", "imageID": "", "ready": False, "restartCount": 0,
                 "state": {"terminated": terminated}},
            ],
        }  # fmt: skip
        self.core.patch_namespaced_pod_status(pod, namespace, {"status": status})

    def restart_fill(self, namespace: str, pod: str, restarts: int) -> None:
        """Play the kubelet: the fill-executor sidecar of ``pod`` crashed and was restarted ``restarts`` times."""
        status = {
            "initContainerStatuses": [
                {"name": "fill-executor", "image": "fill", "imageID": "", "ready": True, "restartCount": restarts,
                 "started": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                 "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}},
            ]
        }  # fmt: skip
        self.core.patch_namespaced_pod_status(pod, namespace, {"status": status})


@contextmanager
def serving(servers: list[tuple[Any, threading.Thread]]) -> Iterator[None]:
    """Yield; then stop each metrics server (``prometheus_client.start_http_server``'s server and thread)."""
    try:
        yield
    finally:
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join()


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == kind), None)


def phase(value: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: (obj.get("status") or {}).get("phase") == value


def running(count: int, generation: int = 0) -> Callable[[list[dict[str, Any]]], bool]:
    """``count`` pods of ``generation``, all Running on a node."""

    def check(pods: list[dict[str, Any]]) -> bool:
        ok = [
            p
            for p in pods
            if p["metadata"]["labels"].get("pipefill.io/generation") == str(generation)
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        return len(ok) == count and len(pods) == count

    return check


def operator_requests(cp: ControlPlane, user: str, *, namespace: str | None = None) -> list[dict[str, Any]]:
    """The audit events of ``user``'s resource requests (in ``namespace`` if given)."""
    out = []
    for event in cp.audit_events():
        if (event.get("user") or {}).get("username") != user or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        if namespace is None or ref.get("namespace") == namespace:
            out.append(event)
    return out
