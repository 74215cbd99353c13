"""Every Prometheus registry the project exports, built the way the components build them.

``fresh()`` holds only what the code itself puts there (metrics and the label values it pre-initialises from its
fixed sets); ``every_label(registry)`` adds one child to every labelled metric, so its label names show up in
``collect()`` without the test knowing each metric. ``pipefill local``'s own collector is included with one
unreachable child (its target-up and restart series then exist).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from pipefill.local.metrics import ChildrenCollector
from pipefill.local.runner import RunOutcome
from pipefill_fill.metrics import FillMetrics
from pipefill_hook.session import hook_gauge
from pipefill_operator.metrics import FillQueueMetrics, OperatorMetrics
from pipefill_trainer.metrics import TrainerMetrics

__all__ = ["COMPONENTS", "EXAMPLE", "every_label", "fresh", "label_names", "label_values"]

COMPONENTS = ("trainer", "fill", "operator", "local")
EXAMPLE = "example"
"""The value ``every_label`` gives labels nobody set (never a real label value, so it cannot pass for one)."""


@dataclass
class _Down:
    """A child of ``pipefill local`` whose metrics port nobody listens on (port 1: refused at once)."""

    rank: int = 0
    container: str = "fill-executor"
    metrics_port: int = 1


def fresh() -> dict[str, CollectorRegistry]:
    """One registry per component, as each process builds it (CPU: no NVML metrics)."""
    out = {name: CollectorRegistry() for name in COMPONENTS}
    TrainerMetrics(out["trainer"])
    hook_gauge(out["trainer"])  # the bubble hook serves the trainer's metrics and this one (spec.trainer)
    FillMetrics(out["fill"])
    OperatorMetrics(out["operator"])
    FillQueueMetrics(out["operator"])  # the same process and registry (pipefill_operator.__main__)
    outcome = RunOutcome(code=0, reason="", process_restarts={(0, "fill-executor"): 0})
    out["local"].register(ChildrenCollector(lambda: [_Down()], outcome=outcome, timeout_s=1.0))
    return out


def _collectors(registry: CollectorRegistry) -> Iterable[Collector]:
    return list(registry._collector_to_names)


def every_label(registry: CollectorRegistry) -> CollectorRegistry:
    """``registry`` with a child on every labelled metric (labels not set yet get ``EXAMPLE``)."""
    for collector in _collectors(registry):
        if isinstance(collector, MetricWrapperBase) and collector._labelnames:
            collector.labels(**dict.fromkeys(collector._labelnames, EXAMPLE))
    return registry


def label_names(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Metric family → the label names its samples carry (``le`` and ``quantile`` excluded: Prometheus' own)."""
    return {
        family.name: {k for s in family.samples for k in s.labels} - {"le", "quantile"}
        for family in every_label(registry).collect()
    }


def label_values(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Label name → the values the registry's samples carry, over all its families (``le``, ``quantile`` excluded)."""
    values: dict[str, set[str]] = {}
    for family in registry.collect():
        for s in family.samples:
            for k, v in s.labels.items():
                if k not in ("le", "quantile"):
                    values.setdefault(k, set()).add(v)
    return values
