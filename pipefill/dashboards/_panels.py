"""Builders shared by the three dashboards: variables, panels with Prometheus targets, stable panel ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard, prometheus
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.models import dashboard as model

from pipefill.dashboards.queries import UIDS

__all__ = ["Board", "Q"]

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
"""Every panel and variable queries the data source the ``$datasource`` variable picks."""

_ANY = ".+"
"""What "All" matches: any value, so an unset variable never hides series."""


@dataclass(frozen=True)
class Q:
    """One Prometheus target: the PromQL expression and the legend Grafana draws for each of its series."""

    expr: str
    legend: str = ""


def _query_variable(name: str, label: str, query: str, *, multi: bool) -> dashboard.QueryVariable:
    var = (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
    )
    if multi:
        var = var.include_all(True).all_value(_ANY)
    return var


class Board:
    """A dashboard under construction: panels get ids in the order they are added (ids stay stable as long as the
    order does, so links to a panel survive a re-render)."""

    def __init__(self, stem: str, title: str, description: str, *, one_job: bool, fill_jobs: bool = False) -> None:
        self._next_id = 1
        self._builder = (
            dashboard.Dashboard(title)
            .uid(UIDS[stem])
            .description(description)
            .tags(["pipefill"])
            .time("now-1h", "now")
            .refresh("30s")
            .timezone("browser")
            .tooltip(model.DashboardCursorSync.CROSSHAIR)
            .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
            .with_variable(
                _query_variable(
                    "namespace", "Namespace", "label_values(pipefill_trainer_steps_total, namespace)", multi=not one_job
                )
            )
            .with_variable(
                _query_variable(
                    "training_job",
                    "Training job",
                    'label_values(pipefill_trainer_steps_total{namespace=~"$namespace"}, training_job)',
                    multi=not one_job,
                )
            )
        )
        if fill_jobs:
            self._builder = self._builder.with_variable(
                _query_variable(
                    "fill_job",
                    "Fill job",
                    'label_values(pipefill_fill_items_total{namespace=~"$namespace", training_job=~"$training_job"}, fill_job)',
                    multi=True,
                )
            )

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def row(self, title: str) -> Board:
        self._builder = self._builder.with_row(dashboard.Row(title).id(self._id()))
        return self

    def timeseries(
        self, title: str, description: str, unit: str, *targets: Q, span: int = 12, height: int = 8
    ) -> Board:
        panel = timeseries_panel.Panel().fill_opacity(10).line_width(1)
        return self._add(panel, title, description, unit, targets, span, height)

    def stat(self, title: str, description: str, unit: str, *targets: Q, span: int = 6, height: int = 4) -> Board:
        return self._add(stat_panel.Panel(), title, description, unit, targets, span, height)

    def _add(
        self,
        panel: timeseries_panel.Panel | stat_panel.Panel,
        title: str,
        description: str,
        unit: str,
        targets: tuple[Q, ...],
        span: int,
        height: int,
    ) -> Board:
        panel = panel.id(self._id()).title(title).description(description).datasource(DATASOURCE)
        panel = panel.unit(unit).span(span).height(height)
        for i, q in enumerate(targets):
            target = prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(q.expr).range()
            panel = panel.with_target(target.legend_format(q.legend) if q.legend else target)
        self._builder = self._builder.with_panel(panel)
        return self

    def build(self) -> Any:
        """The SDK's dashboard model (encode it with ``grafana_foundation_sdk.cog.encoder.JSONEncoder``)."""
        return self._builder.build()
