"""Load after admission (#22, "bad input, tried in bulk"): many jobs deleted at once and a thousand FillJobs created
at once, on the real control plane. Each must end reported — never an operator error, a restart storm, a stuck
object or a reconcile loop that never settles."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fill_queue_helpers import FILL_PLURAL, Fill, fill_manifest, scheduled
from operator_harness import GROUP, PLURAL, VERSION, Kube, OperatorProcess, job_manifest, phase, running

pytestmark = pytest.mark.cluster

_PROBLEMS = re.compile(r"Traceback|\bERROR\b")


def _no_errors(operator: OperatorProcess) -> None:
    found = [line for line in operator.log_text().splitlines() if _PROBLEMS.search(line)]
    assert not found, found[:10]


def _settled(operator: OperatorProcess, kube: Kube, namespace: str) -> None:
    """The reconciles stop: after a probe job is reconciled twice (created, then Running), no other reconcile ran
    meanwhile than the probe's — the deleted jobs' keys were let go, not looked at again and again."""
    before = operator.metric("pipefill_operator_reconciles_total", {"kind": "job", "result": "ok"}) or 0.0
    kube.create_job(namespace, job_manifest("probe"))
    kube.wait_pods(namespace, "probe", running(2))
    kube.wait_job(namespace, "probe", phase("Running"))
    after = operator.metric("pipefill_operator_reconciles_total", {"kind": "job", "result": "ok"}) or 0.0
    assert after - before <= 6, (before, after)  # the probe's own: created, pods seen (batched), Running


@pytest.mark.timeout(300)
def test_a_hundred_jobs_deleted_at_once_take_every_child_with_them_and_the_operator_settles(
    kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator()
    names = [f"j{i:03d}" for i in range(100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: kube.create_job(namespace, job_manifest(n)), names))
    # every one reconciled: its generation recorded and its pods created (4 kwok nodes: most stay Pending)
    kube._watch(kube.core.list_namespaced_pod, (namespace,), lambda pods: len(pods) == 200, 180, "200 rank pods")
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(lambda n: kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, n), names)
        )
    kube.wait_gone(kube.core.list_namespaced_pod, namespace, "every rank pod", timeout_s=180)
    services = kube.core.list_namespaced_service(namespace).items
    assert not services, [s.metadata.name for s in services]
    _settled(operator, kube, namespace)
    _no_errors(operator)


@pytest.mark.timeout(300)
def test_a_thousand_fill_jobs_at_once_each_get_their_verdict_and_the_pass_stays_fast(
    kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator()
    kube.create_job(namespace, job_manifest("host"))
    kube.wait_pods(namespace, "host", running(2))
    kube.wait_job(namespace, "host", phase("Running"))
    fill = Fill(kube, namespace)
    jobs = [fill_manifest(f"f{i:04d}", totalSamples=64 + i, priority=i % 7) for i in range(1000)]
    jobs += [
        fill_manifest("huge", totalSamples=10**12),
        fill_manifest("nowhere", hostSelector={"matchLabels": {"x": "y"}}),
    ]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(fill.create, jobs))

    def verdicts(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]]] | None:
        done = len(items) == len(jobs) and all(scheduled(o).get("reason") for o in items)
        return (items,) if done else None

    (listed,) = kube._watch(
        kube.custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, FILL_PLURAL), verdicts, 180,
        "a Scheduled condition on every FillJob",
    )  # fmt: skip
    items = {o["metadata"]["name"]: o for o in listed}
    assert scheduled(items["nowhere"])["reason"] == "NoMatchingHost"
    placed = [n for n, o in items.items() if (o.get("status") or {}).get("assignments")]
    assert 1 <= len(placed) <= 4, placed  # 2 ranks × PIPEFILL_FILL_MAX_ACTIVE_JOBS (2): the rest wait with a reason
    huge = items["huge"].get("status") or {}
    assert len(huge.get("slices") or []) <= 1024 or not huge.get("assignments")  # a bounded plan, whatever its size
    # the pure pass over 1 002 jobs stays well inside the period (30 s): its histogram's largest observation
    largest = operator.metric("pipefill_operator_schedule_pass_seconds_bucket", {"policy": "fifo", "le": "2.5"})
    total = operator.metric("pipefill_operator_schedule_pass_seconds_count", {"policy": "fifo"})
    assert total and largest == total, (largest, total)
    _no_errors(operator)
