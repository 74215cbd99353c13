"""The Fleet dashboard: how much GPU time the fill jobs recovered across training jobs, and what it cost them."""

from __future__ import annotations

from typing import Any

from pipefill.dashboards._panels import Board, Q
from pipefill.dashboards.operator import fill_queue_row, operator_row
from pipefill.dashboards.queries import job_selector, quantile, rate

__all__ = ["build"]

_S = job_selector()
_BUSY = rate("pipefill_fill_busy_seconds_total", _S)
_BUBBLE = rate("pipefill_trainer_bubble_seconds_total", _S)
_STEP_SUM = rate("pipefill_trainer_step_seconds_sum", _S)
_STEP_COUNT = rate("pipefill_trainer_step_seconds_count", _S)
_BASELINE = f"pipefill_trainer_baseline_step_seconds{_S}"


def build() -> Any:
    board = Board(
        "fleet",
        "PipeFill / Fleet",
        "GPU time the fill jobs recovered from pipeline bubbles, per training job, what it cost the training jobs, the "
        "fill queue and the operator.",
        one_job=False,
    )
    board.row("Recovered GPU time")
    board.stat(
        "GPU time recovered",
        "Seconds per second the fill executors ran fill work inside bubbles, summed over all ranks: how many GPUs' "
        "worth of time the fill jobs got.",
        "short",
        Q(f"sum({_BUSY})"),
    )
    board.stat(
        "Share of bubble time recovered",
        "Fill busy seconds ÷ measured bubble seconds of the trainers (announced or not).",
        "percentunit",
        Q(f"sum({_BUSY}) / sum({_BUBBLE})"),
    )
    board.stat(
        "Bubble fraction",
        "Measured idle seconds inside steps ÷ step seconds, over all ranks of the selected jobs.",
        "percentunit",
        Q(f"sum({_BUBBLE}) / sum({_STEP_SUM})"),
    )
    board.stat(
        "Fill items per second",
        "Units of fill work (samples, or steps for training) done per second by all fill executors.",
        "short",
        Q(f"sum({rate('pipefill_fill_items_total', _S)})"),
    )
    board.timeseries(
        "GPU time recovered per training job",
        "Fill busy seconds per second, summed over the job's ranks.",
        "short",
        Q(f"sum by (training_job) ({_BUSY})", "{{training_job}}"),
    )
    board.timeseries(
        "Share of bubble time recovered per training job",
        "Fill busy seconds ÷ measured bubble seconds, per training job.",
        "percentunit",
        Q(f"sum by (training_job) ({_BUSY}) / sum by (training_job) ({_BUBBLE})", "{{training_job}}"),
    )
    board.row("Training jobs")
    board.timeseries(
        "Bubble fraction per training job",
        "Measured idle seconds inside steps ÷ step seconds, over the job's ranks.",
        "percentunit",
        Q(f"sum by (training_job) ({_BUBBLE}) / sum by (training_job) ({_STEP_SUM})", "{{training_job}}"),
        span=8,
    )
    board.timeseries(
        "Step time against the no-fill baseline",
        "Mean wall time of one optimizer step with fill running beside it, and the no-fill baseline: the median step "
        "time of the recent steps the fill did no work in (profiling steps on CPU, steps with the fill held, or a job "
        "without fill; docs/metrics.md).",
        "s",
        Q(f"sum by (training_job) ({_STEP_SUM}) / sum by (training_job) ({_STEP_COUNT})", "{{training_job}} with fill"),
        Q(f"avg by (training_job) ({_BASELINE})", "{{training_job}} no-fill baseline"),
        span=8,
    )
    board.timeseries(
        "Slowdown against the no-fill baseline",
        "Mean step time ÷ the no-fill baseline − 1, per training job: what running the fill costs the training.",
        "percentunit",
        Q(
            f"sum by (training_job) ({_STEP_SUM}) / sum by (training_job) ({_STEP_COUNT}) "
            f"/ avg by (training_job) ({_BASELINE}) - 1",
            "{{training_job}}",
        ),
        span=8,
    )
    board.timeseries(
        "Training tokens per second",
        "Tokens per second of the whole job, from its last step.",
        "short",
        Q(f"max by (training_job) (pipefill_trainer_tokens_per_second{_S})", "{{training_job}}"),
        span=24,
    )
    board.row("Fill jobs")
    board.timeseries(
        "Fill throughput per FillJob",
        "Units of work per second, summed over every rank that runs the FillJob.",
        "short",
        Q(
            f"sum by (fill_job) ({rate('pipefill_fill_items_total', _S)})",
            "{{fill_job}}",
        ),
    )
    board.timeseries(
        "Fill overrun, 99th percentile",
        "How long after a used bubble's expected end the fill yielded the GPU: the delay the fill can add to a step.",
        "s",
        Q(
            quantile(0.99, "pipefill_fill_overrun_seconds", "training_job", _S),
            "{{training_job}}",
        ),
    )
    fill_queue_row(board)
    operator_row(board)
    return board.build()
