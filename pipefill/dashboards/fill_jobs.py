"""The Fill jobs dashboard: each FillJob's committed progress, throughput, where it runs and how it was profiled."""

from __future__ import annotations

from typing import Any

from pipefill.dashboards._panels import Board, Q
from pipefill.dashboards.queries import RATE, fill_selector, job_selector, rate

__all__ = ["build"]

_F = fill_selector()
_BY = "fill_job"
_LEGEND = "{{fill_job}}"
_COMMITTED = f"max by ({_BY}) (pipefill_fill_committed_items{_F})"


def build() -> Any:
    board = Board(
        "fill-jobs",
        "PipeFill / Fill jobs",
        "FillJobs running in the bubbles of the selected training jobs: committed progress, throughput, the ranks "
        "working on each and the execution plan's profile.",
        one_job=False,
        fill_jobs=True,
    )
    board.row("Progress")
    board.timeseries(
        "Progress",
        "Committed units ÷ the FillJob's total units (spec.totalSamples, or steps). Every executor of a split job "
        "reports the job's totals, hence max, not sum.",
        "percentunit",
        Q(f"{_COMMITTED} / max by ({_BY}) (pipefill_fill_job_total_items{_F})", _LEGEND),
        span=8,
    )
    board.timeseries(
        "Estimated time to completion",
        "Units left (total − committed) ÷ the FillJob's throughput over the rate window, at its current pace.",
        "s",
        Q(
            f"(max by ({_BY}) (pipefill_fill_job_total_items{_F}) - {_COMMITTED}) "
            f"/ sum by ({_BY}) ({rate('pipefill_fill_items_total', _F)})",
            _LEGEND,
        ),
        span=8,
    )
    board.timeseries(
        "Committed items",
        "Units of work committed (durable) over the whole FillJob, all slices, and its total.",
        "short",
        Q(_COMMITTED, _LEGEND + " committed"),
        Q(f"max by ({_BY}) (pipefill_fill_job_total_items{_F})", _LEGEND + " total"),
        span=8,
    )
    board.timeseries(
        "Throughput",
        "Units of work done per second (committed or not yet), summed over the ranks running the FillJob.",
        "short",
        Q(f"sum by ({_BY}) ({rate('pipefill_fill_items_total', _F)})", _LEGEND),
        span=24,
    )
    board.timeseries(
        "Commits per second",
        "Output chunks or checkpoints written per second.",
        "short",
        Q(f"sum by ({_BY}) ({rate('pipefill_fill_commits_total', _F)})", _LEGEND),
        span=8,
    )
    board.timeseries(
        "Ranks working on each FillJob",
        "Ranks whose fill executor did work on the FillJob within the rate window.",
        "short",
        Q(f"count by ({_BY}) ({rate('pipefill_fill_items_total', _F)} > 0)", _LEGEND),
        span=8,
    )
    board.timeseries(
        "Items per second, per rank",
        "Units of work per second on each rank.",
        "short",
        Q(
            f"sum by ({_BY}, training_job, rank) ({rate('pipefill_fill_items_total', _F)})",
            _LEGEND + " {{training_job}} rank {{rank}}",
        ),
        span=8,
    )
    board.row("Assignments and failures")
    board.timeseries(
        "Assignments",
        "Slices of FillJobs the operator's fill queue has assigned to rank pods, over all FillJobs.",
        "short",
        Q("sum(pipefill_operator_fill_assignments)", "assigned slices"),
        span=8,
    )
    board.timeseries(
        "FillJobs by phase",
        "FillJobs by status.phase (Queued, Running, Succeeded, Failed, ...), from the operator.",
        "short",
        Q("sum by (phase) (pipefill_operator_fill_jobs)", "{{phase}}"),
        span=8,
    )
    board.timeseries(
        "Reassignments, by reason",
        "Slices moved to another rank per second (their host ended, failed, was suspended or deleted; unfit).",
        "short",
        Q(f"sum by (reason) (rate(pipefill_operator_fill_reassignments_total[{RATE}]))", "{{reason}}"),
        span=8,
    )
    board.timeseries(
        "Failures reported by the executors",
        "Times an executor failed the FillJob (the workload raised, or it could not start or finish a slice), "
        "summed over the executors, since each started.",
        "short",
        Q(f"sum by ({_BY}) (pipefill_fill_job_failures_total{_F})", _LEGEND),
        span=12,
    )
    board.timeseries(
        "Fill executor memory",
        "Memory each rank's fill work holds (on GPU its allocator's reservation, on CPU its resident set's growth), "
        "against its budget.",
        "bytes",
        Q(
            "max by (training_job, rank) (pipefill_fill_memory_used_bytes" + job_selector() + ")",
            "{{training_job}} rank {{rank}}",
        ),
        Q(
            "max by (training_job, rank) (pipefill_fill_memory_budget_bytes" + job_selector() + ")",
            "{{training_job}} rank {{rank}} budget",
        ),
        span=12,
    )
    board.row("Execution plan")
    board.timeseries(
        "Profiled step time by batch size",
        "Median step time the executor measured per batch size before planning (per rank; the largest shown).",
        "s",
        Q(f"max by ({_BY}, batch_size) (pipefill_fill_profile_step_seconds{_F})", _LEGEND + " batch {{batch_size}}"),
        span=8,
    )
    board.timeseries(
        "Profiled peak memory by batch size",
        "Peak device memory of one step per batch size (per rank; the largest shown).",
        "bytes",
        Q(f"max by ({_BY}, batch_size) (pipefill_fill_profile_peak_bytes{_F})", _LEGEND + " batch {{batch_size}}"),
        span=8,
    )
    board.timeseries(
        "Bubbles skipped, by reason",
        "Bubbles of the selected training jobs the fill did not use, per second: short, memory, idle (no work), "
        "time, closed, profiling.",
        "short",
        Q(f"sum by (reason) ({rate('pipefill_fill_bubbles_skipped_total', job_selector())})", "{{reason}}"),
        span=8,
    )
    return board.build()
