"""The operator's rows of the Fleet dashboard: its reconciles, the jobs it manages, and the fill queue's pass.

The operator is one process per installation, scraped through its ServiceMonitor: its series carry the operator's
namespace (not the training jobs') and no ``training_job``, so these queries select nothing by ``$namespace`` or
``$training_job`` and sum over every operator the data source sees.
"""

from __future__ import annotations

from pipefill.dashboards._panels import Board, Q
from pipefill.dashboards.queries import quantile, rate

__all__ = ["fill_queue_row", "operator_row"]


def operator_row(board: Board) -> None:
    board.row("Operator")
    board.timeseries(
        "Reconciles per second, by result",
        "PipelineTrainingJob reconciles: ok, retry (a temporary error: conflict, API server busy), invalid (the spec "
        "can never work: InvalidSpec), error (unexpected; backed off).",
        "short",
        Q(f"sum by (kind, result) ({rate('pipefill_operator_reconciles_total')})", "{{kind}} {{result}}"),
        span=8,
    )
    board.timeseries(
        "Reconcile errors per second, by result",
        "Reconciles that did not complete: retry, invalid or error.",
        "short",
        Q(f"sum by (kind, result) ({rate('pipefill_operator_reconcile_errors_total')})", "{{kind}} {{result}}"),
        span=8,
    )
    board.timeseries(
        "Reconcile duration",
        "Wall time of one reconcile, API calls included: median and 99th percentile.",
        "s",
        Q(quantile(0.5, "pipefill_operator_reconcile_duration_seconds", "kind"), "{{kind}} p50"),
        Q(quantile(0.99, "pipefill_operator_reconcile_duration_seconds", "kind"), "{{kind}} p99"),
        span=8,
    )
    board.timeseries(
        "PipelineTrainingJobs by phase",
        "Jobs the operator manages, by status.phase.",
        "short",
        Q("sum by (phase) (pipefill_operator_jobs)", "{{phase}}"),
        span=8,
    )
    board.timeseries(
        "Whole-job restarts, by cause",
        "Gang restarts the operator decided since it started: failure (counted against backoffLimit) or disruption "
        "(eviction, a lost node; not counted).",
        "short",
        Q("sum by (cause) (pipefill_operator_job_restarts_total)", "{{cause}}"),
        span=8,
    )
    board.timeseries(
        "API request duration, 99th percentile",
        "One request to the API server, by HTTP method: the control plane's share of a reconcile.",
        "s",
        Q(quantile(0.99, "pipefill_operator_api_request_duration_seconds", "method"), "{{method}}"),
        span=8,
    )


def fill_queue_row(board: Board) -> None:
    board.row("Fill queue")
    board.stat(
        "FillJobs waiting",
        "FillJobs queued for an assignment (the operator's scheduling pass).",
        "short",
        Q("sum(pipefill_operator_fill_queue_length)"),
    )
    board.stat(
        "Assignments",
        "Slices of FillJobs assigned to rank pods now.",
        "short",
        Q("sum(pipefill_operator_fill_assignments)"),
    )
    board.timeseries(
        "Scheduling pass duration",
        "Wall time of one pass of the fill queue over the cluster, by policy: 99th percentile.",
        "s",
        Q(quantile(0.99, "pipefill_operator_schedule_pass_seconds", "policy"), "{{policy}} p99"),
    )
