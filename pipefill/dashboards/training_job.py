"""The Training job dashboard: one job's bubbles per rank, how well they are predicted and filled, its GPUs and restarts."""

from __future__ import annotations

from typing import Any

from pipefill.dashboards._panels import Board, Q
from pipefill.dashboards.queries import job_selector, quantile, rate

__all__ = ["build"]

_S = job_selector()
_TRAINER = job_selector('container="trainer"')
_FILL = job_selector('container="fill-executor"')


def build() -> Any:
    board = Board(
        "training-job",
        "PipeFill / Training job",
        "One PipelineTrainingJob: bubbles per rank and kind, predicted against measured, the fill work done in them, "
        "GPU use per device and restarts.",
        one_job=True,
    )
    board.row("Bubbles")
    board.timeseries(
        "Bubble seconds per rank and kind",
        "Measured idle seconds per second inside steps, announced or not (kind: warm-up, steady, cool-down, "
        "end-of-step).",
        "percentunit",
        Q(f"sum by (rank, kind) ({rate('pipefill_trainer_bubble_seconds_total', _S)})", "rank {{rank}} {{kind}}"),
    )
    board.timeseries(
        "Bubbles announced per second, by kind",
        "Bubbles opened on the channel (predicted at least minBubbleMilliseconds long).",
        "short",
        Q(f"sum by (kind) ({rate('pipefill_trainer_bubbles_announced_total', _S)})", "{{kind}}"),
    )
    board.timeseries(
        "Predicted against measured bubble time, by kind",
        "Idle seconds per second inside steps, summed over ranks: predicted by the trainer's timeline (learned from "
        "the measured waits; every bubble, announced or not) and measured.",
        "percentunit",
        Q(f"sum by (kind) ({rate('pipefill_trainer_bubble_predicted_seconds_total', _S)})", "{{kind}} predicted"),
        Q(f"sum by (kind) ({rate('pipefill_trainer_bubble_seconds_total', _S)})", "{{kind}} measured"),
    )
    board.timeseries(
        "Predicted, offered and measured bubble time per rank",
        "Per rank, per second: predicted idle time (every bubble), the part offered to the fill (announced bubbles, "
        "expected end − open) and the measured idle time. Offered is smaller where bubbles are too short to announce.",
        "percentunit",
        Q(f"sum by (rank) ({rate('pipefill_trainer_bubble_predicted_seconds_total', _S)})", "rank {{rank}} predicted"),
        Q(f"sum by (rank) ({rate('pipefill_fill_offered_seconds_total', _S)})", "rank {{rank}} offered"),
        Q(f"sum by (rank) ({rate('pipefill_trainer_bubble_seconds_total', _S)})", "rank {{rank}} measured"),
    )
    board.timeseries(
        "Bubble prediction error",
        "|predicted − measured| ÷ measured length of each announced bubble: median and 90th percentile per rank.",
        "percentunit",
        Q(quantile(0.5, "pipefill_trainer_bubble_prediction_error_ratio", "rank", _S), "rank {{rank}} p50"),
        Q(quantile(0.9, "pipefill_trainer_bubble_prediction_error_ratio", "rank", _S), "rank {{rank}} p90"),
        span=24,
    )
    board.row("Fill")
    board.timeseries(
        "Fill items per second, per rank and FillJob",
        "Units of fill work done per second.",
        "short",
        Q(
            f"sum by (rank, fill_job) ({rate('pipefill_fill_items_total', _S)})",
            "rank {{rank}} {{fill_job}}",
        ),
        span=8,
    )
    board.timeseries(
        "Bubble time recovered per rank",
        "Fill busy seconds ÷ offered (announced) bubble seconds.",
        "percentunit",
        Q(
            f"sum by (rank) ({rate('pipefill_fill_busy_seconds_total', _S)}) "
            f"/ sum by (rank) ({rate('pipefill_fill_offered_seconds_total', _S)})",
            "rank {{rank}}",
        ),
        span=8,
    )
    board.timeseries(
        "Bubbles skipped, by reason",
        "Announced bubbles the fill did not use: short, memory, idle (no work), time, closed, profiling.",
        "short",
        Q(f"sum by (reason) ({rate('pipefill_fill_bubbles_skipped_total', _S)})", "{{reason}}"),
        span=8,
    )
    board.timeseries(
        "Fill overrun past the bubble's end",
        "How long after a used bubble's expected end the fill yielded: median and 99th percentile per rank.",
        "s",
        Q(quantile(0.5, "pipefill_fill_overrun_seconds", "rank", _S), "rank {{rank}} p50"),
        Q(quantile(0.99, "pipefill_fill_overrun_seconds", "rank", _S), "rank {{rank}} p99"),
    )
    board.timeseries(
        "Fill switch cost",
        "Bubble open → the fill runs: wake-up and switch, median per rank.",
        "s",
        Q(quantile(0.5, "pipefill_fill_switch_seconds", "rank", _S), "rank {{rank}}"),
    )
    board.row("Training")
    board.timeseries(
        "Step time against the no-fill baseline",
        "Wall time of one optimizer step: mean per rank, and each rank's no-fill baseline (the median step time of "
        "its recent steps the fill did no work in; docs/metrics.md).",
        "s",
        Q(
            f"sum by (rank) ({rate('pipefill_trainer_step_seconds_sum', _S)}) "
            f"/ sum by (rank) ({rate('pipefill_trainer_step_seconds_count', _S)})",
            "rank {{rank}}",
        ),
        Q(f"max by (rank) (pipefill_trainer_baseline_step_seconds{_S})", "rank {{rank}} no-fill baseline"),
        span=8,
    )
    board.timeseries(
        "Loss",
        "Training loss (mean cross entropy, nats) of the last step.",
        "short",
        Q(f"max by (rank) (pipefill_trainer_loss{_S})", "rank {{rank}}"),
        span=8,
    )
    board.timeseries(
        "Tokens per second",
        "Training tokens per second of the whole job, last step.",
        "short",
        Q(f"max(pipefill_trainer_tokens_per_second{_S})", "tokens/s"),
        span=8,
    )
    board.row("GPU")
    board.timeseries(
        "GPU utilization per device",
        "NVML utilization of each rank's GPU. Per device, not per container: under time-slicing or MPS it counts "
        "the trainer's and the fill's kernels together (NVML cannot tell them apart). Only on GPU.",
        "percentunit",
        Q(f"max by (rank) (pipefill_trainer_gpu_utilization_ratio{_TRAINER})", "rank {{rank}}"),
    )
    board.timeseries(
        "GPU memory per device",
        "NVML memory in use and total per rank's GPU (trainer and fill together; only on GPU).",
        "bytes",
        Q(f"max by (rank) (pipefill_trainer_gpu_memory_used_bytes{_TRAINER})", "rank {{rank}} used"),
        Q(f"max by (rank) (pipefill_trainer_gpu_memory_total_bytes{_TRAINER})", "rank {{rank}} total"),
    )
    board.timeseries(
        "Fill executor memory",
        "Memory each rank's fill executor holds (on GPU its allocator's reservation on the device, which NVML's "
        "device figure cannot separate from the trainer's; on CPU the growth of its resident set since it started), "
        "against its budget.",
        "bytes",
        Q(f"max by (rank) (pipefill_fill_memory_used_bytes{_FILL})", "rank {{rank}} in use"),
        Q(f"max by (rank) (pipefill_fill_memory_budget_bytes{_FILL})", "rank {{rank}} budget"),
        span=24,
    )
    board.row("Restarts")
    board.timeseries(
        "Restarts",
        "Whole-job restarts from the checkpoints, and restarts of one container alone (a crashed fill executor; "
        "training goes on). Under pipefill local from its own counters; on a cluster from kube-state-metrics.",
        "short",
        Q(f"max(pipefill_local_job_restarts_total{_S})", "job restarts (pipefill local)"),
        Q(
            f"max by (rank, container) (pipefill_local_container_restarts_total{_S})",
            "rank {{rank}} {{container}} (pipefill local)",
        ),
        Q(
            'sum by (pod, container) (kube_pod_container_status_restarts_total{namespace=~"$namespace", '
            'pod=~"$training_job-[0-9]+"})',
            "{{pod}} {{container}}",
        ),
        span=24,
    )
    return board.build()
