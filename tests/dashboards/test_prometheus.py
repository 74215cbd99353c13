"""Every dashboard panel evaluated by a real Prometheus that scraped a real ``pipefill local`` run.

The queries come from the JSON the chart ships (charts/pipefill/dashboards/, kept current by ``make lint``). Each
must parse, return at least one series, and mention only metrics that exist in ``/api/v1/series`` and labels those
series carry, so neither an ``or vector(0)`` nor a mistyped label can make a dead panel pass. Queries of metrics only
a GPU or a cluster feeds (``pipefill.dashboards.NOT_LOCAL``) are checked for parsing only and must be the ones
docs/dashboards.md lists. The same results draw docs/img/dashboard-*.png (``make dashboard-images`` rewrites them).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_run import operator_with_jobs
from prometheus_run import SCRAPE_INTERVAL_S, STATIC_LABELS, ScrapedRun, run_scraped
from promql_names import mentions, substitute

from pipefill.dashboards import NOT_LOCAL, rules
from pipefill.dashboards.plot import draw
from pipefill.devcluster import ControlPlane

pytestmark = [pytest.mark.busy, pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(300)]  # untimed
ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "charts" / "pipefill" / "dashboards").glob("*.json"))
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane) -> Iterator[ScrapedRun]:
    tmp = tmp_path_factory.mktemp("scrape")
    with operator_with_jobs(control_plane, tmp) as operator, run_scraped(tmp, operator) as run:
        yield run


def _values(run: ScrapedRun) -> dict[str, str]:
    """What Grafana would substitute: the run's labels and a rate window of five scrapes."""
    return {**STATIC_LABELS, "fill_job": run.fill_job, "__rate_interval": f"{5 * SCRAPE_INTERVAL_S}s"}


def _targets() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                yield board["title"], panel, target


def problems(run: ScrapedRun, expr: str) -> tuple[list[str], str]:
    """What is wrong with one query over the run's window, and how it was checked: ``full`` or ``parse-only`` (a GPU
    or cluster metric)."""
    metrics, labels = mentions(expr)
    if not metrics:
        return [f"{expr}: mentions no metric"], "full"
    prom = run.prometheus
    not_local = metrics & NOT_LOCAL.keys()
    if not_local:
        prom.query_range(expr, run.start_s, run.end_s)  # must parse; no series expected on CPU
        mixed = metrics - NOT_LOCAL.keys()
        return ([f"{expr}: mixes {sorted(mixed)} with GPU/cluster-only {sorted(not_local)}"] if mixed else []), (
            "parse-only"
        )
    found = []
    if not prom.query_range(expr, run.start_s, run.end_s):
        found.append(f"{expr}: no series")
    carried: set[str] = set()
    for metric in sorted(metrics):
        series = prom.series(metric, run.start_s, run.end_s)
        if not series:
            found.append(f"{expr}: metric {metric} does not exist in /api/v1/series")
        carried.update(*(s.keys() for s in series))
    if missing := labels - carried:
        found.append(f"{expr}: label(s) {sorted(missing)} on none of the series of {sorted(metrics)}")
    return found, "full"


def test_every_panel_query_returns_series_of_metrics_and_labels_that_exist(scraped: ScrapedRun) -> None:
    failures, parse_only, checked = [], [], 0
    for title, panel, target in _targets():
        expr = substitute(target["expr"], _values(scraped))
        found, how = problems(scraped, expr)
        name = f"{title} / {panel['title']} ({target['refId']})"
        failures += [f"{name}: {f}" for f in found]
        if how == "parse-only":
            parse_only.append(name)
        checked += 1
    assert not failures, f"{len(failures)} of {checked} queries fail against {scraped.version}:\n" + "\n".join(failures)
    assert checked - len(parse_only) > 50
    docs = (ROOT / "docs" / "dashboards.md").read_text()
    listed = set(re.findall(r"^- `(.+ / .+ \([A-Z]\))`", docs, re.MULTILINE))
    assert listed == set(parse_only), "docs/dashboards.md must list exactly the parse-only targets"


def test_the_recording_rules_record_the_run(scraped: ScrapedRun) -> None:
    """The chart's rule file, loaded by the same Prometheus, records every series from the run's real data."""
    for name in rules.RECORDS:
        got = scraped.prometheus.query_range(f'{name}{{training_job="cpu-demo"}}', scraped.start_s, scraped.end_s)
        values = [float(v) for series in got for _, v in series["values"]]
        assert values and any(math.isfinite(v) for v in values), f"{name}: {got}"
    busy = scraped.prometheus.query_range(
        "training_job:pipefill_fill_busy_seconds:rate5m", scraped.start_s, scraped.end_s
    )
    assert max(float(v) for _, v in busy[0]["values"]) > 0  # the fill recovered some GPU time


def test_the_checks_catch_dead_panels(scraped: ScrapedRun) -> None:
    """The checks themselves: a made-up metric hidden behind ``or vector(0)``, a label no series carries and a
    syntax error all fail."""
    window = '{namespace="pipefill-test"}[5s]'
    dead, _ = problems(scraped, f"sum(rate(pipefill_fill_no_such_total{window})) or vector(0)")
    assert any("does not exist" in p for p in dead)
    mislabeled, _ = problems(scraped, f"sum by (exported_job) (rate(pipefill_fill_items_total{window}))")
    assert any("exported_job" in p for p in mislabeled)
    with pytest.raises(AssertionError, match="bad_data"):
        problems(scraped, "sum(rate(pipefill_fill_items_total[5s])")


def test_variables_list_the_runs_namespace_training_job_and_fill_job(scraped: ScrapedRun) -> None:
    values = _values(scraped)
    expected = {"namespace": values["namespace"], "training_job": values["training_job"], "fill_job": scraped.fill_job}
    seen = 0
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            match = _LABEL_VALUES.match(var["query"])
            assert match, f"{path.name} ${var['name']}: {var['query']} is not label_values(selector, label)"
            selector = substitute(match["selector"], values)
            got = scraped.prometheus.get(
                f"/api/v1/label/{match['label']}/values",
                **{"match[]": selector, "start": str(scraped.start_s), "end": str(scraped.end_s)},
            )
            assert expected[var["name"]] in got, f"{path.name} ${var['name']}: {got}"
            seen += 1
    assert seen == 7  # namespace and training_job on three dashboards, fill_job on one


def test_pictures_of_every_dashboard_from_the_scraped_data(scraped: ScrapedRun, tmp_path: Path) -> None:
    out = Path(os.environ.get("PIPEFILL_DASHBOARD_IMAGES") or tmp_path)
    values = _values(scraped)

    def results(panel: dict[str, Any], target: dict[str, Any]) -> list[dict[str, Any]]:
        return scraped.prometheus.query_range(substitute(target["expr"], values), scraped.start_s, scraped.end_s)

    def empty_reason(panel: dict[str, Any]) -> str:
        names = set().union(*(mentions(t["expr"])[0] for t in panel.get("targets", [])))
        return "; ".join(sorted({NOT_LOCAL[n] for n in names if n in NOT_LOCAL})) or "no series"

    subtitle = f"pipefill local, the CPU demo job (2 stages, 1F1B) and its inference FillJob, and the operator on the control plane, scraped every {SCRAPE_INTERVAL_S} s by {scraped.version.split(' (')[0]}"
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        png = out / f"dashboard-{path.stem}.png"
        drawn = draw(board, results, png, start_s=scraped.start_s, subtitle=subtitle, empty_reason=empty_reason)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        panels = {p["id"]: p for p in board["panels"] if p["type"] != "row"}
        assert drawn.keys() == panels.keys()
        for panel_id, count in drawn.items():
            local = any(not mentions(t["expr"])[0] & NOT_LOCAL.keys() for t in panels[panel_id]["targets"])
            assert count > 0 or not local, f"{path.name} / {panels[panel_id]['title']}: nothing drawn"
