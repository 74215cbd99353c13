"""The rendered dashboards: fixed uids, the variables every panel relies on, only metrics the registries export, and
a staleness check that catches a missing, changed or unexpected file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from promql_names import mentions

from pipefill.dashboards import NOT_LOCAL, UIDS
from pipefill.dashboards.render import DASHBOARDS, render, stale, write
from pipefill.local.metrics import ChildrenCollector
from pipefill.local.runner import RunOutcome
from pipefill_fill.metrics import FillMetrics
from pipefill_operator.metrics import FillQueueMetrics, OperatorMetrics
from pipefill_trainer.metrics import TrainerMetrics

ROOT = Path(__file__).resolve().parents[2]


def _boards() -> dict[str, dict[str, Any]]:
    return {stem: json.loads(render(stem)) for stem in DASHBOARDS}


def _exported_series_names() -> set[str]:
    """Every sample name the trainer's, the fill executor's, the operator's (its fill queue's too) and the local
    runner's registries produce on CPU."""
    registry = CollectorRegistry()
    TrainerMetrics(registry)
    operator = OperatorMetrics(registry)
    FillQueueMetrics(registry)
    operator.record(result="retry", duration_s=0.01, own_s=0.0)
    operator.api_request("GET", 0.01)
    fill = FillMetrics(registry)
    fill.job_started("j", total=2, committed=1)
    fill.items.labels("j").inc()
    fill.committed_items.labels("j").set(1)
    fill.commits.labels("j").inc()
    fill.bubbles_skipped.labels("short").inc()
    fill.profile("j", [(1, 0.1, 10)])
    outcome = RunOutcome(code=0, reason="", process_restarts={(0, "fill-executor"): 1})
    registry.register(ChildrenCollector(lambda: [], outcome=outcome))
    return {s.name for family in registry.collect() for s in family.samples}


def test_uids_are_fixed_and_every_panel_queries_the_chosen_datasource() -> None:
    for stem, board in _boards().items():
        assert board["uid"] == UIDS[stem]
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:3] == ["datasource", "namespace", "training_job"]
        for var in board["templating"]["list"][1:]:
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ids = [p["id"] for p in board["panels"]]
        assert len(set(ids)) == len(ids)
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and panel["description"]
            for target in panel["targets"]:
                if all(m.startswith("pipefill_operator_") for m in mentions(target["expr"])[0]):
                    continue  # the operator's series carry its own namespace, not the jobs' (dashboards/operator.py)
                assert "$namespace" in target["expr"] and "$training_job" in target["expr"], target["expr"]
    assert len({b["uid"] for b in _boards().values()}) == 3


def test_queries_use_only_metrics_the_registries_export() -> None:
    exported = _exported_series_names()
    documented = (ROOT / "docs" / "metrics.md").read_text()
    for board in _boards().values():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                for name in mentions(target["expr"])[0]:
                    if name in NOT_LOCAL:  # GPU-only (documented) or kube-state-metrics
                        assert name.startswith("kube_") or f"`{name}`" in documented, name
                    else:
                        assert name in exported, f"{board['title']} / {panel['title']}: {name}"


def test_stale_reports_missing_changed_and_unexpected_files(tmp_path: Path) -> None:
    assert {p.name for p in write(tmp_path)} == {f"{stem}.json" for stem in DASHBOARDS}
    assert stale(tmp_path) == []
    (tmp_path / "fleet.json").write_text((tmp_path / "fleet.json").read_text().replace("Bubble", "Bobble"))
    (tmp_path / "fill-jobs.json").unlink()
    (tmp_path / "old.json").write_text("{}")
    assert stale(tmp_path) == [
        f"{tmp_path}/fleet.json: differs from what pipefill/dashboards renders",
        f"{tmp_path}/fill-jobs.json: missing",
        f"{tmp_path}/old.json: no dashboard renders it",
    ]


@pytest.mark.parametrize("fresh", [True, False])
def test_the_check_command_exits_1_on_stale_files(tmp_path: Path, fresh: bool) -> None:
    write(tmp_path)
    if not fresh:
        (tmp_path / "training-job.json").write_text("{}\n")
    done = subprocess.run(
        [sys.executable, "-m", "pipefill.dashboards", "--check", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == (0 if fresh else 1)
    assert ("make dashboards" in done.stderr) != fresh


def test_the_chart_holds_the_current_render() -> None:
    assert stale(ROOT / "charts" / "pipefill" / "dashboards") == []
