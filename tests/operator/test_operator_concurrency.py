"""The operator's shared state under concurrency, in-process against the real API server.

kopf runs a plain ``def`` handler in its thread pool and awaits an ``async def`` one on the event loop. The tests here
drive the operator's real handlers exactly so, from many threads at once, while its workers and the fill queue's pass
run on the loop: no key may be lost or reconciled twice, and no pass may break on a dictionary changed under it (both
happened with plain ``def`` handlers: 1 of 1 000 jobs never Running, 112 tracebacks in 5 minutes). And the status
write of one reconcile must not answer for another's: a postponed write that read another job's answer was the job
left Pending for good.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kopf
import pytest
from operator_harness import job_manifest
from prometheus_client import CollectorRegistry

from pipefill.children import JOB_LABEL
from pipefill.devcluster import ControlPlane
from pipefill.pods import GENERATION_LABEL, RANK_LABEL
from pipefill.spec import PipelineTrainingJobStatus
from pipefill_operator.apply import PTJ, RANKS_READY_INTERVAL_S, Applier
from pipefill_operator.cache import ClusterCache
from pipefill_operator.controller import Controller, OperatorConfig
from pipefill_operator.fillqueue import FillQueue, QueueConfig
from pipefill_operator.handlers import register
from pipefill_operator.kube import Kube, load_configuration
from pipefill_operator.metrics import FillQueueMetrics, OperatorMetrics

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio]

_EVENTS = 6000  # pod events, each of its own job: every key is added exactly once
_THREADS = 8


def _pod(namespace: str, index: int) -> dict[str, Any]:
    job = f"job-{index:04d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-0",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(index + 1),
            "labels": {JOB_LABEL: job, RANK_LABEL: "0", GENERATION_LABEL: "1"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"containers": [{"name": "trainer", "ports": [{"name": "trainer-metrics", "containerPort": 9400}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }


def _fill_job(namespace: str) -> dict[str, Any]:
    """A FillJob the pass has to look at (so the pass runs and iterates the pods the handlers add)."""
    return {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "FillJob",
        "metadata": {
            "name": "infer",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": "2026-11-26T00:00:00Z",
        },
        "spec": {
            "workload": {"kind": "inference", "builtin": "encoder-inference"},
            "output": {"path": "/fill/infer"},
            "totalSamples": 64,
        },
    }


def _reconciles(registry: CollectorRegistry) -> float:
    return sum(
        s.value
        for m in registry.collect()
        if m.name == "pipefill_operator_reconciles"
        for s in m.samples
        if s.name.endswith("_total")
    )


def _as_kopf_would(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], **kwargs: Any) -> None:
    """Call a handler the way kopf does from its thread pool: a plain function in the calling thread, a coroutine
    function awaited on the event loop."""
    if asyncio.iscoroutinefunction(fn):
        asyncio.run_coroutine_threadsafe(fn(**kwargs), loop).result(timeout=30)
    else:
        fn(**kwargs)


@pytest.mark.timeout(120)
async def test_handlers_driven_from_kopfs_threads_lose_no_key_and_break_no_pass(
    operator_kubeconfig: Path, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    kube = Kube(load_configuration(str(operator_kubeconfig)))
    cache = ClusterCache(kube, namespaces=(namespace,))
    fill = FillQueue(
        kube, FillQueueMetrics(registry), QueueConfig(debounce_s=0.0, namespaces=(namespace,)), cache=cache
    )
    controller = Controller(kube, OperatorMetrics(registry), OperatorConfig(namespaces=(namespace,)), fill=fill)
    handlers = register(controller, kopf.OperatorRegistry())
    caplog.set_level(logging.WARNING, logger="pipefill_operator")
    await controller.start()
    try:
        loop = asyncio.get_running_loop()
        job_event = handlers.get("fill_job_event")
        assert job_event is not None
        await loop.run_in_executor(
            None, lambda: _as_kopf_would(loop, job_event, type="ADDED", body=_fill_job(namespace))
        )
        pods = [_pod(namespace, i) for i in range(_EVENTS)]

        def send(pod: dict[str, Any]) -> None:
            _as_kopf_would(loop, handlers["pod_event"], type="ADDED", body=copy.deepcopy(pod))

        passes_before = fill.passes
        first = _EVENTS // 2
        for pod in pods[:first]:  # a cluster of some size first (one thread): the pass takes a while over it
            await loop.run_in_executor(None, send, pod)
        with ThreadPoolExecutor(_THREADS) as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, send, pod) for pod in pods[first:]))
        await asyncio.wait_for(controller.queue.wait_idle(), timeout=60)
        assert fill.passes > passes_before, "the fill queue never passed while the handlers ran"
        # every key was added exactly once: reconciled exactly once (a lost key is fewer, a key taken by two
        # workers more)
        assert _reconciles(registry) == _EVENTS
        assert len(cache.pods.objects) == _EVENTS
        assert all(len(cache.pods.pods_of((namespace, f"job-{i:04d}"))) == 1 for i in range(_EVENTS))
        # what the cache keeps of a pod is a projection: no managedFields
        assert all("managedFields" not in p["metadata"] for p in cache.pods.objects.values())
    finally:
        await controller.stop()
    broken = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not broken, broken


@pytest.mark.timeout(60)
async def test_a_postponed_status_write_is_its_callers_answer_whatever_other_jobs_write_meanwhile(
    control_plane: ControlPlane, operator_kubeconfig: Path, namespace: str
) -> None:
    """Two reconciles share one Applier. Job a's ranksReady change, right after its last write, is postponed (its
    reconcile must look again); job b's write, made before a's reconcile reads the answer, goes through. Read from
    shared state, a's answer was b's: not postponed, and nothing looked at job a again."""
    kube = Kube(load_configuration(str(operator_kubeconfig)))
    admin = Kube(load_configuration(str(control_plane.kubeconfig)))  # the user, who creates the jobs
    applier = Applier(kube)
    try:
        bodies = {}
        for name in ("a", "b"):
            manifest = job_manifest(name)
            manifest["metadata"]["namespace"] = namespace
            bodies[name] = await admin.create(manifest)
        assert bodies["a"] is not None and bodies["b"] is not None
        empty = PipelineTrainingJobStatus()
        written, postponed = await applier.status(bodies["a"], empty, PipelineTrainingJobStatus(ranks_ready=1))
        assert written is not None and not postponed
        started = time.monotonic()
        answer_a = applier.status(
            written, PipelineTrainingJobStatus(ranks_ready=1), PipelineTrainingJobStatus(ranks_ready=2)
        )
        answer_b = applier.status(bodies["b"], empty, PipelineTrainingJobStatus(ranks_ready=1))
        (written_a, postponed_a), (written_b, postponed_b) = await asyncio.gather(answer_a, answer_b)
        assert time.monotonic() - started < RANKS_READY_INTERVAL_S, "too slow to test the interval here"
        assert written_a is None and postponed_a
        assert written_b is not None and not postponed_b
        stored = await kube.get(PTJ, "a", namespace)
        assert stored is not None and stored["status"].get("ranksReady") == 1
    finally:
        await kube.close()
        await admin.close()
