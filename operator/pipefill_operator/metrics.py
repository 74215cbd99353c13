"""The operator's own metrics (``pipefill_operator_*``), in a registry passed in (each test makes its own).

Label values come from small fixed sets: ``kind`` (the two custom kinds), ``result``, ``phase``, ``cause``,
``policy``, ``reason``. No label is named job, namespace, instance or pod: Prometheus sets those when it scrapes
(docs/metrics.md).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipefill.queue import POLICIES
from pipefill.spec import FillJobPhase, JobPhase

__all__ = ["REASSIGNMENT_REASONS", "RESULTS", "FillQueueMetrics", "OperatorMetrics"]

# ok: decided and applied; retry: a temporary error (conflict, API unavailable), looked at again soon;
# invalid: a permanent error (the spec can never work), reported as InvalidSpec; error: an unexpected failure
RESULTS = ("ok", "retry", "invalid", "error")
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_KIND = "PipelineTrainingJob"
# why a placement with work left was released: its pod is gone, its rank reported the job unfit, the job was
# suspended or cancelled
REASSIGNMENT_REASONS = ("pod_gone", "unfit", "suspended", "cancelled")
_PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "pipefill_operator"
        self.reconciles = Counter(
            f"{p}_reconciles_total", "Reconciles by kind and result.", ["kind", "result"], registry=registry
        )
        self.errors = Counter(
            f"{p}_reconcile_errors_total",
            "Reconciles that did not complete, by kind and result (retry, invalid, error).",
            ["kind", "result"],
            registry=registry,
        )
        self.duration = Histogram(
            f"{p}_reconcile_duration_seconds",
            "Wall time of one reconcile, API calls included.",
            ["kind"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.own_duration = Histogram(
            f"{p}_reconcile_own_seconds",
            "Wall time of one reconcile minus the time spent waiting on the API server.",
            ["kind"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.jobs = Gauge(f"{p}_jobs", "PipelineTrainingJobs by phase.", ["phase"], registry=registry)
        self.restarts = Counter(
            f"{p}_job_restarts_total",
            "Whole-job restarts decided, by cause (failure: counted against backoffLimit; disruption: not).",
            ["cause"],
            registry=registry,
        )
        self.status_reads = Counter(
            f"{p}_status_reads_total",
            "Scrapes of rank pods' metrics endpoints for status, by result (ok, error).",
            ["result"],
            registry=registry,
        )
        self.api_duration = Histogram(
            f"{p}_api_request_duration_seconds",
            "Wall time of one request to the API server, by HTTP method: the control plane's share of a reconcile.",
            ["method"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.queue_depth = Gauge(f"{p}_queue_depth", "Jobs waiting for a reconcile.", registry=registry)
        for result in RESULTS:
            self.reconciles.labels(_KIND, result)
        for phase in JobPhase:
            self.jobs.labels(phase.value)
        for cause in ("failure", "disruption"):
            self.restarts.labels(cause)
        self._phases: dict[object, str] = {}

    def api_request(self, method: str, duration_s: float) -> None:
        self.api_duration.labels(method).observe(duration_s)

    def record(self, *, result: str, duration_s: float, own_s: float) -> None:
        self.reconciles.labels(_KIND, result).inc()
        if result != "ok":
            self.errors.labels(_KIND, result).inc()
        self.duration.labels(_KIND).observe(duration_s)
        self.own_duration.labels(_KIND).observe(max(own_s, 0.0))

    def set_phase(self, key: object, phase: str | None) -> None:
        """Track the phase of job ``key`` (None: the job is gone) in the jobs-by-phase gauge."""
        old = self._phases.pop(key, None)
        if old is not None:
            self.jobs.labels(old).dec()
        if phase is not None:
            self._phases[key] = phase
            self.jobs.labels(phase).inc()


class FillQueueMetrics:
    """The fill queue's metrics (one scheduling loop per operator)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "pipefill_operator"
        self.queue_length = Gauge(
            f"{p}_fill_queue_length",
            "FillJobs with work left waiting for a host (after the last pass).",
            registry=registry,
        )
        self.assignments = Gauge(
            f"{p}_fill_assignments", "Slice assignments to rank pods (after the last pass).", registry=registry
        )
        self.reassignments = Counter(
            f"{p}_fill_reassignments_total",
            "Slices with work left taken from a pod, by reason (pod_gone, unfit, suspended, cancelled).",
            ["reason"],
            registry=registry,
        )
        self.pass_duration = Histogram(
            f"{p}_schedule_pass_seconds",
            "Wall time of one scheduling pass (the pure pass, without the status writes), by policy.",
            ["policy"],
            buckets=_PASS_BUCKETS,
            registry=registry,
        )
        self.fill_jobs = Gauge(f"{p}_fill_jobs", "FillJobs by phase.", ["phase"], registry=registry)
        for reason in REASSIGNMENT_REASONS:
            self.reassignments.labels(reason)
        for policy in POLICIES:
            self.pass_duration.labels(policy)
        for phase in FillJobPhase:
            self.fill_jobs.labels(phase.value)

    def phases(self, counts: dict[str, int]) -> None:
        for phase in FillJobPhase:
            self.fill_jobs.labels(phase.value).set(counts.get(phase.value, 0))
