"""No metric label anywhere is named after a label Prometheus sets itself when it scrapes.

``job``, ``instance`` (every target), ``namespace`` and ``pod`` (a PodMonitor's target labels): a metric label of one
of these names is renamed ``exported_<name>`` at the scrape (``honor_labels: false``) or overwrites the target's
(``honor_labels: true``), so queries grouping by it break either way. Checked over every registry the project
exports, with a child on every labelled metric so that no label name hides behind an unused metric.
"""

from __future__ import annotations

import pytest
from registries import COMPONENTS, every_label, fresh, label_names

RESERVED = {"job", "instance", "namespace", "pod"}


@pytest.mark.parametrize("component", COMPONENTS)
def test_no_label_is_named_job_instance_namespace_or_pod(component: str) -> None:
    names = label_names(fresh()[component])
    assert names, f"{component}: no metrics"
    clashes = {metric: labels & RESERVED for metric, labels in names.items() if labels & RESERVED}
    assert not clashes, f"{component}: metric labels Prometheus sets itself (rename them, e.g. fill_job): {clashes}"


def test_every_metric_shows_its_labels() -> None:
    """The check above sees label names only through samples: after ``every_label`` every family has some."""
    for component, registry in fresh().items():
        empty = [f.name for f in every_label(registry).collect() if not f.samples]
        assert not empty, f"{component}: families without samples hide their label names: {empty}"


def test_the_fill_job_label_is_fill_job() -> None:
    """Family names (a counter's without ``_total``)."""
    names = label_names(fresh()["fill"])
    for metric in ("pipefill_fill_items", "pipefill_fill_committed_items", "pipefill_fill_commits"):
        assert names[metric] == {"fill_job"}, metric
