"""The fill executor's metrics: names, units and the recovery ratio, read from the test's own registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pipefill_fill.metrics import FillMetrics


def test_bubble_accounting_and_recovery() -> None:
    registry = CollectorRegistry()
    m = FillMetrics(registry)
    m.bubble(offered_s=0.050, busy_s=0.045, overrun_s=0.0005, used=True)
    m.bubble(offered_s=0.010, busy_s=0.0, overrun_s=0.0, used=False)
    m.bubbles_skipped.labels("short").inc()
    m.items.labels("embed").inc(48)
    m.profile("embed", [(16, 0.07, 5 << 30)])
    value = registry.get_sample_value
    assert value("pipefill_fill_bubbles_seen_total") == 2
    assert value("pipefill_fill_bubbles_used_total") == 1
    assert value("pipefill_fill_offered_seconds_total") == pytest.approx(0.060)
    assert value("pipefill_fill_busy_seconds_total") == pytest.approx(0.045)
    assert value("pipefill_fill_bubble_recovery_ratio") == pytest.approx(0.75)
    assert value("pipefill_fill_overrun_seconds_count") == 1
    assert value("pipefill_fill_overrun_seconds_bucket", {"le": "0.001"}) == 1
    assert value("pipefill_fill_bubbles_skipped_total", {"reason": "short"}) == 1
    assert value("pipefill_fill_items_total", {"fill_job": "embed"}) == 48
    assert value("pipefill_fill_profile_step_seconds", {"fill_job": "embed", "batch_size": "16"}) == 0.07
    names = {metric.name for metric in registry.collect()}
    assert all(n.startswith("pipefill_fill_") for n in names)
