"""Every FillJob of the queue is in report.json, report.md and the closing summary (issue #30), the ones never
started too, with their phase and why they wait: a user tells queued from lost."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from manifests import fill_job
from test_local_run import _job

from pipefill.cli.local import _summary
from pipefill.events import CommitEvent, EventWriter, JobEvent
from pipefill.local.report import build_report, rank_log_paths, write_report
from pipefill.spec import load_training_job


def _fill(work: Path, name: str, *, total: int, priority: int) -> None:
    doc = fill_job(name, output=f"o/{name}", totalSamples=total, priority=priority)
    (work / f"{name}.yaml").write_text(yaml.safe_dump(doc))


def test_queued_jobs_are_listed_with_their_position(tmp_path: Path) -> None:
    job = load_training_job(_job(tmp_path, steps=1, fill=True))
    work = tmp_path / "filljobs"
    work.mkdir()
    for name, total, priority in [("done", 256, 4), ("busy", 512, 4), ("next", 768, 3), ("last", 1024, 0)]:
        _fill(work, name, total=total, priority=priority)
    _fill(work, "unfit", total=64, priority=1)
    (work / "done.status.json").write_text(json.dumps({"phase": "Succeeded", "samplesDone": 256}))
    (work / "busy.status.json").write_text(json.dumps({"phase": "Running", "samplesDone": 128}))
    (work / "unfit.status.json").write_text(json.dumps({"phase": "Queued", "message": "fits no bubble of rank 0"}))
    with EventWriter(rank_log_paths(tmp_path, 0)[1]) as log:
        log.write(CommitEvent(job="done", end=256, bytes=1, commit_s=0.0))
        log.write(JobEvent(job="done", phase="Succeeded", committed=256, total=256))
        log.write(CommitEvent(job="busy", end=128, bytes=1, commit_s=0.0))
    report = build_report(job, tmp_path, outcome={"code": 0, "reason": "training finished"})
    rows = report["fill_jobs"]
    assert list(rows) == ["busy", "done", "next", "unfit", "last"]  # the queue's order: priority, then name
    assert {n: (r["phase"], r["committed"], r["total"]) for n, r in rows.items()} == {
        "busy": ("Running", 128, 512),
        "done": ("Succeeded", 256, 256),
        "next": ("Queued", 0, 768),
        "unfit": ("Queued", 0, 64),
        "last": ("Queued", 0, 1024),
    }
    assert [n for n, r in rows.items() if not r["started"]] == ["next", "unfit", "last"]
    assert rows["next"]["waiting"].startswith("position 1 of 3 waiting (priority 3)")
    assert rows["last"]["waiting"].startswith("position 3 of 3")
    assert rows["unfit"]["waiting"] == "fits no bubble of rank 0"  # its status says why
    summary = _summary(report)
    assert "busy 128/512 Running" in summary and "done 256/256 Succeeded" in summary
    assert "never started (3, in queue order): next 0/768 Queued, unfit 0/64 Queued, last 0/1024 Queued" in summary
    files = write_report(job, tmp_path, outcome={"code": 0, "reason": "training finished"})
    markdown = Path(files["report.md"]).read_text()
    assert "| last | 0 | 1024 | Queued: position 3 of 3 waiting" in markdown
    assert set(json.loads(Path(files["report.json"]).read_text())["fill_jobs"]) == set(rows)


def test_a_started_job_back_in_the_queue_says_it_waits_and_keeps_its_work(tmp_path: Path) -> None:
    """When the training ends first, a FillJob goes back to Queued (as on a cluster): the summary says its work is
    kept, not lost (the demo read "embed-corpus 1804/16384 Queued")."""
    job = load_training_job(_job(tmp_path, steps=1, fill=True))
    work = tmp_path / "filljobs"
    work.mkdir()
    _fill(work, "embed", total=16384, priority=0)
    (work / "embed.status.json").write_text(json.dumps({"phase": "Queued", "samplesDone": 1804}))
    with EventWriter(rank_log_paths(tmp_path, 0)[1]) as log:
        log.write(CommitEvent(job="embed", end=1804, bytes=1, commit_s=0.0))
    summary = _summary(build_report(job, tmp_path, outcome={"code": 0, "reason": "training finished"}))
    assert "embed 1804/16384 Queued (waits for a training job's bubbles; its 1804 committed are kept)" in summary
    (work / "embed.status.json").write_text(json.dumps({"phase": "Succeeded", "samplesDone": 16384}))
    summary = _summary(build_report(job, tmp_path, outcome={"code": 0, "reason": "training finished"}))
    assert "embed 16384/16384 Succeeded" in summary and "waits for" not in summary
