"""The PromQL vocabulary the dashboards share: label selectors, rate windows and the labels a scrape adds.

No Grafana SDK here, so tests and tools can use it without the ``dashboards`` extra.

Labels on every series, as a cluster's scrape gives them: ``namespace`` (the target's namespace), ``training_job``,
``rank`` and ``container`` (the PodMonitor relabels them from the pod labels ``pipefill.io/job-name`` and
``pipefill.io/rank`` and the container name; ``pipefill local`` sets ``rank`` and ``container`` itself, and
tests/dashboards adds ``namespace`` and ``training_job`` as static labels of its scrape configuration). The fill
executor's series carry ``fill_job`` (the FillJob's name) themselves: no metric label is named ``job``, ``namespace``,
``instance`` or ``pod``, which Prometheus sets itself and would rename to ``exported_*``.
"""

from __future__ import annotations

__all__ = [
    "JOB",
    "NOT_LOCAL",
    "RATE",
    "UIDS",
    "fill_selector",
    "job_selector",
    "quantile",
    "rate",
]

UIDS = {
    "fleet": "pipefill-fleet",
    "training-job": "pipefill-training-job",
    "fill-jobs": "pipefill-fill-jobs",
}
"""Fixed dashboard uids (file stem → uid): links and provisioning keep working across chart upgrades."""

RATE = "$__rate_interval"
"""Grafana's rate window: at least four scrape intervals, so a rate always has two samples."""

JOB = 'namespace=~"$namespace", training_job=~"$training_job"'
"""The series of the training jobs the variables select (fill executors carry the same two labels)."""

NOT_LOCAL = {
    "pipefill_trainer_gpu_utilization_ratio": "GPU only (NVML; absent on CPU, never faked)",
    "pipefill_trainer_gpu_memory_used_bytes": "GPU only (NVML; absent on CPU, never faked)",
    "pipefill_trainer_gpu_memory_total_bytes": "GPU only (NVML; absent on CPU, never faked)",
    "kube_pod_container_status_restarts_total": "a cluster with kube-state-metrics",
}
"""Metrics only a GPU or a real cluster feeds, with why: their queries are checked for parsing only (tests/dashboards
cannot make a CPU-only local run produce them) and are listed in docs/dashboards.md."""


def job_selector(*extra: str) -> str:
    """``{namespace=~"$namespace", training_job=~"$training_job", <extra>}``."""
    return "{" + ", ".join([JOB, *extra]) + "}"


def fill_selector(*extra: str) -> str:
    """The job selector narrowed to the FillJobs the ``$fill_job`` variable selects."""
    return job_selector('fill_job=~"$fill_job"', *extra)


def rate(metric: str, selector: str = "") -> str:
    """``rate(<metric><selector>[$__rate_interval])``."""
    return f"rate({metric}{selector}[{RATE}])"


def quantile(q: float, histogram: str, by: str, selector: str = "") -> str:
    """The ``q`` quantile of ``histogram`` over the rate window, per value of the ``by`` labels."""
    return f"histogram_quantile({q}, sum by ({by}, le) ({rate(histogram + '_bucket', selector)}))"
