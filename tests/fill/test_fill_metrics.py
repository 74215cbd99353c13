"""The fill executor's metrics: names, units and the recovery ratio, read from the test's own registry."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from commit_helpers import dispatcher
from fill_helpers import subprocess_env, write_job
from prometheus_client import CollectorRegistry

from pipefill import env
from pipefill.events import EventWriter
from pipefill_fill.inprofile import PROFILE_MISSES, due_between
from pipefill_fill.jobs import Jobs
from pipefill_fill.metrics import RETAIN_S, SKIP_REASONS, FillMetrics
from pipefill_fill.settings import Settings
from pipefill_fill.sources import Identity, open_source


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


# run in a process of its own: in a test worker, threads of earlier tests' executors may free memory while it reads
# (a CI run read 0 growth after 64 MiB were touched, the process having shrunk by as much since the reading began)
_MEMORY_PROBE = """
import json, torch
from prometheus_client import CollectorRegistry
from pipefill_fill.device import memory_in_use
from pipefill_fill.metrics import FillMetrics
registry = CollectorRegistry()
FillMetrics(registry).watch_memory(memory_in_use(torch.device("cpu")))
read = lambda: registry.get_sample_value("pipefill_fill_memory_used_bytes")
before = read()
work = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched
print(json.dumps([before, read()]))
"""


def test_skip_reasons_exist_from_the_start_and_memory_reads_the_process() -> None:
    registry = CollectorRegistry()
    m = FillMetrics(registry)
    for reason in SKIP_REASONS:
        assert registry.get_sample_value("pipefill_fill_bubbles_skipped_total", {"reason": reason}) == 0
    assert math.isnan(registry.get_sample_value("pipefill_fill_memory_used_bytes") or 0.0)
    probe = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE], env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    before, grown = json.loads(probe.stdout)
    assert 0 <= before < 16 * 2**20  # growth since the reading began: about none yet
    assert grown - before >= 60 * 2**20

    def unreadable() -> int:
        raise OSError("no /proc here")

    m.watch_memory(unreadable)
    assert math.isnan(registry.get_sample_value("pipefill_fill_memory_used_bytes") or 0.0)


def test_jobs_report_total_progress_and_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two FillJobs over the files source: one starts (its total and committed units appear, failures at 0), one
    names a module that does not exist and fails at start (counted once)."""
    jobs_dir = tmp_path / "jobs"
    write_job(jobs_dir, "good", total=48)
    write_job(jobs_dir, "broken", builtin=None, import_path="no_such_module_anywhere:Work")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    registry = CollectorRegistry()
    metrics = FillMetrics(registry)
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    jobs = Jobs(
        source=source,
        device=torch.device("cpu"),
        settings=Settings.from_env(),
        metrics=metrics,
        events=EventWriter(None),
    )
    try:
        jobs.refresh()
        assert set(jobs.active) == {"good"} and jobs.failed == {"broken"}
        # its first measurement, between bubbles (as where it fitted none of the last ones), did work counted as done
        profiler = jobs.active["good"].profiler
        profiler.misses = PROFILE_MISSES
        assert due_between(profiler) and dispatcher(tmp_path, jobs).measure_between() == []
        measured = profiler.last_items
        assert measured > 0 and registry.get_sample_value("pipefill_fill_items_total", {"fill_job": "good"}) == measured
    finally:
        jobs.shutdown()
        source.close()
    value = registry.get_sample_value
    assert value("pipefill_fill_job_total_items", {"fill_job": "good"}) == 48
    assert value("pipefill_fill_committed_items", {"fill_job": "good"}) == 0
    assert value("pipefill_fill_job_failures_total", {"fill_job": "good"}) == 0
    assert value("pipefill_fill_job_failures_total", {"fill_job": "broken"}) == 1


def test_a_job_let_go_of_keeps_its_series_for_a_while_then_they_go() -> None:
    """A long queue of small FillJobs must not grow the executor's series without bound; a retired job's last
    values stay scrapeable for RETAIN_S first, and a job that starts here again keeps its series."""
    registry = CollectorRegistry()
    m = FillMetrics(registry)

    def jobs() -> set[str]:
        return {s.labels["fill_job"] for f in registry.collect() for s in f.samples if "fill_job" in s.labels}

    for job in ("a", "b"):
        m.job_started(job, total=100, committed=0)
        m.profile(job, [(8, 0.001, 1 << 20), (16, 0.002, 2 << 20)])
        m.items.labels(job).inc(10)
    m.retire("a", now_s=0.0)
    m.retire("b", now_s=0.0)
    assert m.prune(now_s=RETAIN_S - 1) == [] and jobs() == {"a", "b"}  # still scrapeable
    m.job_started("b", total=100, committed=10)  # b came back to this executor
    assert m.prune(now_s=RETAIN_S) == ["a"] and jobs() == {"b"}
