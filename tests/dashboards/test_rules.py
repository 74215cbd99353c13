"""The recording and alerting rules: the chart's file is what pipefill/dashboards/rules.py renders, promtool accepts
it, every rule has a ``promtool test rules`` case (series in, samples or alerts out, annotations rendered), and the
rules use only metrics the registries export."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_run import prometheus_binary
from promql_names import mentions
from test_render import _exported_series_names

from pipefill.dashboards import rules

ROOT = Path(__file__).resolve().parents[2]
RULE_FILE = ROOT / "charts" / "pipefill" / "rules" / "pipefill.rules.yaml"
JOB = 'namespace="ml", training_job="llm"'


def _series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def _record(name: str, value: float, at: str = "10m") -> dict[str, Any]:
    labels = f"{name}{{{JOB}}}"
    return {"expr": name, "eval_time": at, "exp_samples": [{"labels": labels, "value": value}]}


def _overrun_buckets() -> list[dict[str, str]]:
    """Rank 0's fill: 10 used bubbles a scrape, every overrun between 5 and 10 ms."""
    labels = f'{JOB}, rank="0"'
    out = [
        _series("pipefill_fill_overrun_seconds_bucket", f'{labels}, le="{le}"', "0+0x80") for le in ("0.001", "0.005")
    ]
    out += [
        _series("pipefill_fill_overrun_seconds_bucket", f'{labels}, le="{le}"', "0+10x80") for le in ("0.01", "+Inf")
    ]
    return out


# Two ranks, one scrape every 30 s: fill busy 7.5 + 15 s and bubbles 7.5 + 7.5 s per scrape (rates exact in binary:
# promtool compares exactly); steps of 0.5 s on average
# (15 s of steps in 30 steps per scrape) against a no-fill baseline of 0.4 s on both ranks.
_JOB_SERIES = [
    _series("pipefill_fill_busy_seconds_total", f'{JOB}, rank="0"', "0+7.5x80"),
    _series("pipefill_fill_busy_seconds_total", f'{JOB}, rank="1"', "0+15x80"),
    _series("pipefill_trainer_bubble_seconds_total", f'{JOB}, rank="0", kind="steady"', "0+7.5x80"),
    _series("pipefill_trainer_bubble_seconds_total", f'{JOB}, rank="1", kind="steady"', "0+7.5x80"),
    _series("pipefill_trainer_step_seconds_sum", f'{JOB}, rank="0"', "0+15x80"),
    _series("pipefill_trainer_step_seconds_count", f'{JOB}, rank="0"', "0+30x80"),
    _series("pipefill_trainer_baseline_step_seconds", f'{JOB}, rank="0"', "0.4x80"),
    _series("pipefill_trainer_baseline_step_seconds", f'{JOB}, rank="1"', "0.4x80"),
]


def _alert(name: str, labels: dict[str, str], annotations: dict[str, str], at: str) -> dict[str, Any]:
    expected = {"exp_labels": {**labels, "severity": "warning"}, "exp_annotations": annotations}
    return {"alertname": name, "eval_time": at, "exp_alerts": [expected]}


def unit_tests() -> dict[str, Any]:
    job = {"namespace": "ml", "training_job": "llm"}
    slowdown = rules.ALERTS[0]["annotations"]
    return {
        "rule_files": [str(RULE_FILE)],
        "evaluation_interval": "30s",
        "tests": [
            {
                "name": "per training job: recovered GPU time, bubble time, step time, slowdown; slowdown alert",
                "interval": "30s",
                "input_series": _JOB_SERIES,
                "promql_expr_test": [
                    _record("training_job:pipefill_fill_busy_seconds:rate5m", 0.75),
                    _record("training_job:pipefill_trainer_bubble_seconds:rate5m", 0.5),
                    _record("training_job:pipefill_trainer_step_seconds:mean5m", 0.5),
                    _record("training_job:pipefill_trainer_slowdown:ratio5m", 0.25),
                ],
                "alert_rule_test": [
                    {"alertname": "PipeFillTrainingSlowdown", "eval_time": "20m", "exp_alerts": []},  # pending
                    _alert(
                        "PipeFillTrainingSlowdown",
                        job,
                        {
                            "summary": slowdown["summary"].replace(
                                "{{ $labels.namespace }}/{{ $labels.training_job }}", "ml/llm"
                            ),
                            "description": slowdown["description"].replace("{{ $value | humanizePercentage }}", "25%"),
                        },
                        "40m",
                    ),
                ],
            },
            {
                "name": "fill overrun alert",
                "interval": "30s",
                "input_series": _overrun_buckets(),
                "alert_rule_test": [
                    {"alertname": "PipeFillFillOverrun", "eval_time": "10m", "exp_alerts": []},  # pending
                    _alert(
                        "PipeFillFillOverrun",
                        {**job, "rank": "0"},
                        {
                            "summary": "The fill of ml/llm rank 0 overruns its bubbles",
                            "description": rules.ALERTS[1]["annotations"]["description"].replace(
                                "{{ $value | humanizeDuration }}", "9.95ms"
                            ),
                        },
                        "30m",
                    ),
                ],
            },
            {
                "name": "failing FillJob alert",
                "interval": "1m",
                "input_series": [
                    _series("pipefill_fill_job_failures_total", f'{JOB}, rank="1", fill_job="embed"', "0 0 0 1 1 1")
                ],
                "alert_rule_test": [
                    {"alertname": "PipeFillFillJobFailing", "eval_time": "2m", "exp_alerts": []},
                    _alert(
                        "PipeFillFillJobFailing",
                        {**job, "fill_job": "embed"},
                        {
                            "summary": "FillJob embed failed on ml/llm",
                            "description": rules.ALERTS[2]["annotations"]["description"],
                        },
                        "4m",
                    ),
                ],
            },
            {
                "name": "operator reconcile errors alert",
                "interval": "30s",
                "input_series": [
                    _series(
                        "pipefill_operator_reconcile_errors_total",
                        'kind="PipelineTrainingJob", result="error"',
                        "0+1x80",
                    ),
                    _series(
                        "pipefill_operator_reconcile_errors_total",
                        'kind="PipelineTrainingJob", result="retry"',
                        "0+5x80",
                    ),
                ],
                "alert_rule_test": [
                    {"alertname": "PipeFillOperatorReconcileErrors", "eval_time": "10m", "exp_alerts": []},
                    _alert(
                        "PipeFillOperatorReconcileErrors",
                        {"kind": "PipelineTrainingJob"},
                        {
                            "summary": "The PipeFill operator keeps failing to reconcile PipelineTrainingJobs",
                            "description": rules.ALERTS[3]["annotations"]["description"],
                        },
                        "30m",
                    ),
                ],
            },
        ],
    }


def _promtool() -> str:
    return str(prometheus_binary().with_name("promtool"))


def test_the_chart_holds_the_current_rules() -> None:
    assert RULE_FILE.read_text(encoding="utf-8") == rules.render(), "run `make dashboards`"


def test_promtool_checks_the_rule_file() -> None:
    done = subprocess.run([_promtool(), "check", "rules", str(RULE_FILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules.RECORDS) + len(rules.ALERTS)} rules found" in done.stdout


def test_promtool_unit_tests_cover_every_rule(tmp_path: Path) -> None:
    tests = unit_tests()
    recorded = {t["expr"] for case in tests["tests"] for t in case.get("promql_expr_test", [])}
    alerted = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
    assert recorded == set(rules.RECORDS)
    assert alerted == {a["alert"] for a in rules.ALERTS}
    path = tmp_path / "pipefill.rules.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("broken", ["record", "alert"])
def test_a_wrong_expectation_fails(tmp_path: Path, broken: str) -> None:
    """The unit tests can fail: a recorded value or an alert's label off by a little is reported."""
    tests = unit_tests()
    case = tests["tests"][0]
    if broken == "record":
        case["promql_expr_test"][0]["exp_samples"][0]["value"] = 0.76
    else:
        case["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["training_job"] = "other"
    path = tmp_path / "broken.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and "FAILED" in done.stdout + done.stderr


def test_rules_use_only_exported_metrics() -> None:
    exported = _exported_series_names() | set(rules.RECORDS)
    for name, expr in [*rules.RECORDS.items(), *((a["alert"], a["expr"]) for a in rules.ALERTS)]:
        assert mentions(expr)[0] <= exported, (name, mentions(expr)[0] - exported)
