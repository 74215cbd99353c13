"""The operator's parts that need no API server: the work queue, the status reader (against real metrics endpoints
on loopback), the status patch, the node index and the metrics registry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pipefill.lifecycle.conditions import set_condition
from pipefill.spec import JobPhase, PipelineTrainingJobStatus
from pipefill_operator.apply import status_patch
from pipefill_operator.metrics import OperatorMetrics
from pipefill_operator.prerequisites import NodeIndex
from pipefill_operator.statusreader import (
    StatusReader,
    job_figures,
    job_progress,
    metric_sums,
    paced,
    scrape_targets,
)
from pipefill_operator.workqueue import Backoff, WorkQueue


def test_work_queue_dedups_serializes_and_requeues_a_key_added_while_processing() -> None:
    async def scenario() -> list[str]:
        queue = WorkQueue()
        seen = []
        for key in ("a", "b", "a", "a"):
            queue.add(key)
        assert len(queue) == 2
        first = await queue.get()
        queue.add(first)  # an event arrives while a worker is on it: not handed to a second worker now
        second = await queue.get()
        assert (first, second) == ("a", "b") and len(queue) == 0
        queue.done(first)  # ... but queued again once the first is done
        seen.append(str(await queue.get()))
        queue.done("a")
        queue.done("b")
        queue.add_after("c", 0.05)
        queue.add_after("c", 10)  # a later delayed add does not postpone the earlier one
        seen.append(str(await asyncio.wait_for(queue.get(), 2)))
        queue.add_after("d", 10)
        queue.forget("d")
        queue.close()
        return seen

    assert asyncio.run(scenario()) == ["a", "c"]


def test_batched_adds_of_a_burst_are_one_key_and_the_queue_is_busy_meanwhile() -> None:
    async def scenario() -> list[str]:
        queue = WorkQueue()
        queue.add_after("a", 30)  # a deadline of the same key: a batch neither moves nor drops it
        for _ in range(5):
            queue.add_batched("a", 0.05)
        assert len(queue) == 0  # the window is open: nothing to take yet ...
        idle = asyncio.ensure_future(queue.wait_idle())
        await asyncio.sleep(0)
        assert not idle.done()  # ... but the queue is not idle
        first = await asyncio.wait_for(queue.get(), 2)
        assert len(queue) == 0  # the five adds are one key
        queue.add_batched("a", 0.01)  # an event while a worker is on it: a new batch, taken after done
        await asyncio.sleep(0.05)
        queue.done(first)
        second = await asyncio.wait_for(queue.get(), 2)
        queue.done(second)
        await asyncio.wait_for(idle, 2)
        assert "a" in queue._timers  # the deadline still stands
        queue.close()
        return [str(first), str(second)]

    assert asyncio.run(scenario()) == ["a", "a"]


def test_status_reads_are_paced_to_their_rate() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        began = loop.time()
        costs = {"a": 2, "b": 0, "c": 4, "d": 1}
        return [round(loop.time() - began, 2) async for _ in paced(costs, costs.__getitem__, 20.0)]

    at = asyncio.run(scenario())
    # a at once; b once a's 2 endpoints are due (0.1 s); c at the same time (b read none); d after c's 4 (0.3 s)
    assert at[0] < 0.05 and 0.1 <= at[1] < 0.2 and 0.1 <= at[2] < 0.2 and 0.3 <= at[3] < 0.45, at


def test_backoff_doubles_to_a_cap_and_resets() -> None:
    backoff = Backoff(base_s=0.5, max_s=3)
    assert [backoff.next_delay_s("k") for _ in range(5)] == [0.5, 1, 2, 3, 3]
    backoff.reset("k")
    assert backoff.next_delay_s("k") == 0.5


def test_status_patch_writes_changed_fields_only_and_never_the_readers() -> None:
    old = PipelineTrainingJobStatus(current_step=7, start_time="2026-01-01T00:00:00Z")
    new = PipelineTrainingJobStatus(phase=JobPhase.RUNNING, current_step=3)
    set_condition(new.conditions, "Running", True, "AllRanksRunning", "", now="2026-01-01T00:00:01Z", generation=2)
    patch = status_patch(old, new)
    assert patch == {
        "phase": "Running",
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "AllRanksRunning",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:01Z",
                "observedGeneration": 2,
            }
        ],
        "startTime": None,
    }
    assert status_patch(new, new) == {}
    final = PipelineTrainingJobStatus(phase=JobPhase.SUCCEEDED, current_step=100)  # the reader stops with the job
    assert status_patch(new, final) == {"phase": "Succeeded", "currentStep": 100, "conditions": []}


def test_node_index_tells_which_resources_some_node_offers() -> None:
    index = NodeIndex()
    gpu = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": "8"}}}
    assert index.update(gpu) == {"nvidia.com/gpu"} and index.offers("nvidia.com/gpu")
    assert index.update({"metadata": {"name": "n2"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}) == set()
    index.update(gpu, deleted=True)
    assert index.offers("nvidia.com/gpu")
    index.update({"metadata": {"name": "n2"}, "status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    assert not index.offers("nvidia.com/gpu") and not index.offers("cpu")


def test_operator_metrics_track_results_phases_and_restarts() -> None:
    registry = CollectorRegistry()
    m = OperatorMetrics(registry)
    m.record(result="ok", duration_s=0.02, own_s=0.001)
    m.record(result="retry", duration_s=0.01, own_s=0.0)
    m.set_phase(("ns", "a"), "Running")
    m.set_phase(("ns", "b"), "Running")
    m.set_phase(("ns", "a"), "Restarting")
    m.set_phase(("ns", "b"), None)
    m.restarts.labels("failure").inc()
    kind = {"kind": "PipelineTrainingJob"}
    assert registry.get_sample_value("pipefill_operator_reconciles_total", {**kind, "result": "ok"}) == 1
    assert registry.get_sample_value("pipefill_operator_reconcile_errors_total", {**kind, "result": "retry"}) == 1
    assert registry.get_sample_value("pipefill_operator_reconcile_errors_total", {**kind, "result": "ok"}) is None
    assert registry.get_sample_value("pipefill_operator_jobs", {"phase": "Running"}) == 0
    assert registry.get_sample_value("pipefill_operator_jobs", {"phase": "Restarting"}) == 1
    assert registry.get_sample_value("pipefill_operator_job_restarts_total", {"cause": "failure"}) == 1
    assert registry.get_sample_value("pipefill_operator_reconcile_duration_seconds_count", kind) == 2
    names = {s.name for family in registry.collect() for s in family.samples}
    assert all(n.startswith("pipefill_operator_") for n in names)
    labels = {k for family in registry.collect() for s in family.samples for k in s.labels}
    assert not labels & {"job", "namespace", "instance", "pod"}


def test_job_figures_aggregate_ranks() -> None:
    trainers = [
        {
            "pipefill_trainer_step": 40,
            "pipefill_trainer_step_seconds_sum": 10,
            "pipefill_trainer_bubble_seconds_total": 2,
        },
        {
            "pipefill_trainer_step": 41,
            "pipefill_trainer_step_seconds_sum": 10,
            "pipefill_trainer_bubble_seconds_total": 4,
        },
    ]
    trainers[0] |= {"pipefill_trainer_step_seconds_count": 40, "pipefill_trainer_loss": 2.0}
    trainers[1] |= {"pipefill_trainer_step_seconds_count": 50, "pipefill_trainer_loss": 2.0}
    fills = [{"pipefill_fill_bubble_recovery_ratio": 0.5}, {"pipefill_fill_bubble_recovery_ratio": 0.7}]
    figures = job_figures(trainers, fills)
    assert (figures.current_step, figures.bubble_fraction, figures.fill_utilization) == (40, 0.3, 0.6)
    assert (figures.loss, figures.step_seconds) == (2.0, 0.25)  # the slowest rank's mean step paces the job
    assert job_progress(figures, 100, now_s=1000.0) == (40.0, 1000.0 + 60 * 0.25)
    assert job_progress(figures, None, now_s=0.0) == (None, None)
    assert job_progress(figures, 20, now_s=0.0) == (100.0, 0.0)  # past the steps (a resumed count): done, now
    assert job_figures([], []) == job_figures([{}], [{}])
    assert job_figures([], []).current_step is None


def _serve(registry: CollectorRegistry, host: str) -> tuple[int, Any]:
    server, thread = start_http_server(0, addr=host, registry=registry)
    return server.server_port, (server, thread)


@pytest.fixture
def rank_endpoints() -> Iterator[list[dict[str, Any]]]:
    """Two running rank pods whose trainer and fill endpoints serve real metrics on loopback addresses."""
    servers = []
    pods = []
    for rank, ip in enumerate(("127.0.0.41", "127.0.0.42")):
        trainer, fill = CollectorRegistry(), CollectorRegistry()
        Gauge("pipefill_trainer_step", "", registry=trainer).set(100 + rank)
        Histogram("pipefill_trainer_step_seconds", "", registry=trainer).observe(4.0)
        bubbles = Counter("pipefill_trainer_bubble_seconds_total", "", ["kind"], registry=trainer)
        bubbles.labels("warm-up").inc(0.5)
        bubbles.labels("end-of-step").inc(0.5 + rank)
        Gauge("pipefill_fill_bubble_recovery_ratio", "", registry=fill).set(0.8)
        trainer_port, s1 = _serve(trainer, ip)
        fill_port, s2 = _serve(fill, ip)
        servers += [s1, s2]
        pods.append(
            {
                "status": {"phase": "Running", "podIP": ip},
                "spec": {
                    "initContainers": [
                        {"name": "fill-executor", "ports": [{"name": "fill-metrics", "containerPort": fill_port}]}
                    ],
                    "containers": [
                        {"name": "trainer", "ports": [{"name": "trainer-metrics", "containerPort": trainer_port}]}
                    ],
                },
            }
        )
    yield pods
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join()


def test_status_reader_scrapes_running_pods_on_their_named_ports(rank_endpoints: list[dict[str, Any]]) -> None:
    down = {
        "status": {"phase": "Running", "podIP": "127.0.0.43"},
        "spec": {"containers": [{"ports": [{"name": "trainer-metrics", "containerPort": 9}]}]},
    }
    pending = {"status": {"phase": "Pending"}, "spec": {}}
    pods = [*rank_endpoints, down, pending]
    assert len(scrape_targets(pods)) == 5

    async def read() -> Any:
        reader = StatusReader(timeout_s=2.0, concurrency=2)
        try:
            return await reader.read(pods)
        finally:
            await reader.close()

    figures, answered, failed = asyncio.run(read())
    assert (answered, failed) == (4, 1)
    assert figures.current_step == 100
    assert figures.bubble_fraction == pytest.approx((1.0 / 4 + 2.0 / 4) / 2)
    assert figures.fill_utilization == pytest.approx(0.8)


def test_metric_sums_adds_label_sets() -> None:
    text = 'a_total{kind="x"} 1\na_total{kind="y"} 2\n# TYPE b gauge\nb 3\n'
    assert metric_sums(text) == {"a_total": 3.0, "b": 3.0}
