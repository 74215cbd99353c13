"""The trainer's Prometheus metrics (``pipefill_trainer_*``, documented in ``docs/metrics.md``).

Pass a registry in, so each test reads its own values. GPU utilization and memory come from NVML and exist only when
the trainer runs on a GPU; on CPU they are absent, never faked.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pipefill_trainer.baseline import SOURCES as BASELINE_SOURCES

__all__ = ["BASELINE_SOURCES", "BUBBLE_KINDS", "TrainerMetrics"]

BUBBLE_KINDS = ("warm-up", "steady", "cool-down", "end-of-step")
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ERROR_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)


class TrainerMetrics:
    def __init__(self, registry: CollectorRegistry, *, device_index: int | None = None) -> None:
        self.registry = registry
        self.step_seconds = Histogram(
            "pipefill_trainer_step_seconds",
            "Wall time of one optimizer step.",
            buckets=_STEP_BUCKETS,
            registry=registry,
        )
        self.steps = Counter("pipefill_trainer_steps_total", "Optimizer steps completed.", registry=registry)
        # steps_total restarts at 0 with the process; the operator's status.currentStep needs the job's own count
        self.step = Gauge(
            "pipefill_trainer_step",
            "Optimizer steps the job has completed, counted over restarts (resumed from the checkpoint).",
            registry=registry,
        )
        self.tokens_per_second = Gauge(
            "pipefill_trainer_tokens_per_second",
            "Training tokens per second of the whole job, last step.",
            registry=registry,
        )
        self.loss = Gauge(
            "pipefill_trainer_loss", "Training loss (mean cross entropy, nats), last step.", registry=registry
        )
        self.model_flops = Gauge(
            "pipefill_trainer_model_flops_per_second",
            "Model FLOP/s of the whole job (6 × parameters-ish per token, from the model shape), last step.",
            registry=registry,
        )
        self.bubbles = Counter(
            "pipefill_trainer_bubbles_announced_total", "Bubbles announced on the channel.", ["kind"], registry=registry
        )
        self.bubble_seconds = Counter(
            "pipefill_trainer_bubble_seconds_total",
            "Measured idle seconds of this rank inside steps, announced or not.",
            ["kind"],
            registry=registry,
        )
        self.bubble_predicted_seconds = Counter(
            "pipefill_trainer_bubble_predicted_seconds_total",
            "Predicted idle seconds of this rank inside steps (the simulated timeline, learned from measurements), "
            "announced or not.",
            ["kind"],
            registry=registry,
        )
        self.baseline_step_seconds = Gauge(
            "pipefill_trainer_baseline_step_seconds",
            "No-fill baseline: median wall time of the recent steps the fill did no work in (NaN before the first).",
            registry=registry,
        )
        self.baseline_step_seconds.set(float("nan"))
        self.baseline_steps = Counter(
            "pipefill_trainer_baseline_steps_total",
            "Steps counted into the no-fill baseline, by source (profile, held, no-fill).",
            ["source"],
            registry=registry,
        )
        self.prediction_error = Histogram(
            "pipefill_trainer_bubble_prediction_error_ratio",
            "|predicted − measured| ÷ measured duration of each announced bubble.",
            buckets=_ERROR_BUCKETS,
            registry=registry,
        )
        self._by_kind: dict[str, tuple[Any, Any, Any]] = {}  # kind → its three children, looked up once
        for kind in BUBBLE_KINDS:
            self._children(kind)
        for source in BASELINE_SOURCES:
            self.baseline_steps.labels(source)
        self._nvml: Any = None
        if device_index is not None:
            self._init_nvml(device_index)

    def _init_nvml(self, device_index: int) -> None:
        try:
            import pynvml  # type: ignore[import-untyped]

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:  # no NVML (driver missing): the GPU metrics stay absent
            return
        self._nvml = (pynvml, handle)
        util = Gauge("pipefill_trainer_gpu_utilization_ratio", "NVML GPU utilization (0–1).", registry=self.registry)
        used = Gauge("pipefill_trainer_gpu_memory_used_bytes", "NVML device memory in use.", registry=self.registry)
        total = Gauge("pipefill_trainer_gpu_memory_total_bytes", "NVML device memory.", registry=self.registry)
        util.set_function(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        used.set_function(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        total.set_function(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).total)

    def observe_step(self, *, step: int, step_s: float, tokens: int, loss: float, flops: float) -> None:
        """``step``: the 0-based index of the step just completed, counted from the start of training."""
        self.step_seconds.observe(step_s)
        self.steps.inc()
        self.step.set(step + 1)
        self.loss.set(loss)
        if step_s > 0:
            self.tokens_per_second.set(tokens / step_s)
            self.model_flops.set(flops / step_s)

    def _children(self, kind: str) -> tuple[Any, Any, Any]:
        children = self._by_kind.get(kind)
        if children is None:
            labelled = (
                self.bubble_seconds.labels(kind),
                self.bubble_predicted_seconds.labels(kind),
                self.bubbles.labels(kind),
            )
            children = self._by_kind[kind] = labelled
        return children

    def observe_bubble(self, *, kind: str, measured_s: float, predicted_s: float, announced: bool) -> None:
        seconds, predicted, count = self._children(kind)  # a rank's every wait: no label lookups
        seconds.inc(max(0.0, measured_s))
        predicted.inc(max(0.0, predicted_s))
        if announced:
            count.inc()
            if measured_s > 0:
                self.prediction_error.observe(abs(predicted_s - measured_s) / measured_s)

    def observe_baseline(self, *, source: str, baseline_s: float) -> None:
        """A fill-free step (:class:`pipefill_trainer.baseline.NoFillSteps`) and the baseline it leads to."""
        self.baseline_steps.labels(source).inc()
        self.baseline_step_seconds.set(baseline_s)

    @staticmethod
    def serve(port: int, registry: CollectorRegistry) -> None:
        """Expose ``registry`` on ``port`` (0: no endpoint)."""
        if port:
            start_http_server(port, registry=registry)
