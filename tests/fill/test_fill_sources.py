"""The files work source: manifests, the plan of record it writes, slice claims with epochs and seats by flock, status
merged by concurrent writers in real processes. The Kubernetes source is tested against the real API server in
test_fill_kubernetes.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fill_helpers import subprocess_env, write_job
from waiting import wait_for

from pipefill.queue.status import QUEUE_MARKER
from pipefill.spec import FillJobPhase
from pipefill.spec.fillstatus import SliceProgress
from pipefill_fill.sources import Identity, ProgressReport, open_source
from pipefill_fill.sources.files import FilesSource
from pipefill_fill.work import Slice

ME = Identity(training_job="gpt", rank=1, labels={"pipefill.io/fill-pool": "demo"})


def test_files_source_lists_by_priority_and_selector(jobs_dir: Path) -> None:
    write_job(jobs_dir, "low", priority=1)
    write_job(jobs_dir, "high", priority=9)
    other = write_job(jobs_dir, "elsewhere")
    doc = yaml.safe_load(other.read_text())
    doc["spec"]["hostSelector"] = {"matchLabels": {"pipefill.io/fill-pool": "batch"}}
    other.write_text(yaml.safe_dump(doc))
    (jobs_dir / "broken.yaml").write_text("kind: FillJob\napiVersion: pipefill.io/v1alpha1\nmetadata: {name: x}\n")
    source = open_source(f"files:{jobs_dir}", identity=ME)
    assert [s.name for s in source.poll()] == ["high", "low"]


def test_files_source_status_and_final_phase(jobs_dir: Path) -> None:
    write_job(jobs_dir, "a", total=10)
    source = FilesSource(jobs_dir, identity=ME)
    (spec,) = source.poll()
    assert source.claim(spec, [Slice(0, 10)]) == Slice(0, 10)
    pointers = (SliceProgress(0, 10, 4),)
    source.report("a", ProgressReport(FillJobPhase.RUNNING, 4, 10, throughput_per_s=2.0, slices=pointers))
    status = source.status("a")
    assert status["phase"] == "Running" and status["samplesDone"] == 4 and status["progress"] == 40.0
    assert status["slices"] == [{"start": 0, "end": 10, "committed": 4}]  # the plan of record, written by the source
    assert status["assignments"] == [{"trainingJob": "gpt", "rank": 1, "start": 0, "end": 10, "epoch": 1}]
    assert status["epoch"] == 1
    assert "estimatedCompletionTime" in status
    source.report("a", ProgressReport(FillJobPhase.SUCCEEDED, committed=10, total=10))
    assert source.status("a")["assignments"] == [] and source.poll() == []


def test_a_poll_reads_a_status_again_only_once_it_was_replaced(jobs_dir: Path) -> None:
    """A poll reads every job's status; an unchanged file is not read and parsed again (a queue of 100 jobs is polled
    several times a second), and a replaced one is, whatever wrote it: here a Succeeded written by another process's
    report ends the offer at the next poll."""
    write_job(jobs_dir, "a", total=10)
    source, other = FilesSource(jobs_dir, identity=ME), FilesSource(jobs_dir, identity=ME)
    assert [s.name for s in source.poll()] == ["a"] == [s.name for s in source.poll()]  # the first writes the plan
    first = source._polled["a"][1]
    assert [s.name for s in source.poll()] == ["a"] and source._polled["a"][1] is first  # not read again
    other.report("a", ProgressReport(FillJobPhase.SUCCEEDED, committed=10, total=10))
    assert source.poll() == [] and source._polled["a"][1]["phase"] == "Succeeded"


def test_a_queued_poll_evaluates_only_the_jobs_whose_files_changed(jobs_dir: Path) -> None:
    """Under a queue (``pipefill local``'s), a poll offers the jobs with a slice assigned here. A job whose manifest
    and status file are the ones of the last poll offers the very task it offered then; a replaced status (another
    assignment, a final phase) or manifest (another priority) is evaluated again."""
    (jobs_dir / QUEUE_MARKER).write_text("{}")
    for name in ("a", "b"):
        write_job(jobs_dir, name, total=10)

    def status(name: str, rank: int, phase: str = "Running") -> None:
        assignment = {"trainingJob": "gpt", "rank": rank, "start": 0, "end": 10, "epoch": 1}
        doc = {"phase": phase, "slices": [{"start": 0, "end": 10, "committed": 0}], "assignments": [assignment]}
        tmp = jobs_dir / f".{name}.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(jobs_dir / f"{name}.status.json")  # as every writer does: a new file

    status("a", rank=1)
    status("b", rank=2)
    source = open_source(f"files:{jobs_dir}", identity=ME)
    (a,) = source.poll()
    assert a.name == "a" and source.poll()[0] is a  # nothing changed: not evaluated again
    assert list(source._parsed) == [str(jobs_dir / "a.yaml")]  # b is another executor's: its manifest not parsed
    status("b", rank=1)  # b assigned here now
    first, second = source.poll()
    assert first is a and second.name == "b"
    status("a", rank=1, phase="Succeeded")
    assert [s.name for s in source.poll()] == ["b"]
    manifest = jobs_dir / "b.yaml"
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["priority"] = 7
    manifest.write_text(yaml.safe_dump(doc))
    (b,) = source.poll()
    assert b.priority == 7 and b is not second


def test_files_source_one_owner_at_a_time(jobs_dir: Path) -> None:
    write_job(jobs_dir, "a")
    first = FilesSource(jobs_dir, identity=ME)
    second = FilesSource(jobs_dir, identity=Identity("gpt", 2))
    assert first.acquire("a") and first.acquire("a")
    assert not second.acquire("a")
    first.release("a")
    assert second.acquire("a")
    second.close()


def test_files_source_slices_and_seats(jobs_dir: Path) -> None:
    write_job(jobs_dir, "a", total=256, max_parallel_ranks=2)
    ranks = [FilesSource(jobs_dir, identity=Identity("gpt", r)) for r in range(3)]
    (spec,) = ranks[0].poll()
    slices = [Slice(0, 64), Slice(64, 128), Slice(128, 192), Slice(192, 256)]
    assert ranks[0].claim(spec, slices) == Slice(0, 64)
    assert ranks[0].claim(spec, slices) == Slice(0, 64)  # the one it holds
    assert ranks[1].claim(spec, slices) == Slice(64, 128)  # another slice: one holder each
    assert ranks[2].claim(spec, slices[2:]) is None  # maxParallelRanks executors work on it already
    ranks[0].release("a", Slice(0, 64))
    assert ranks[0].claim(spec, slices[2:]) == Slice(128, 192)  # it kept its seat
    ranks[1].release("a")
    assert ranks[2].claim(spec, slices[1:]) == Slice(64, 128)  # the seat and the slice came free
    assert (jobs_dir / "a.locks" / "slice-000000000064-000000000128.lock").read_text().startswith("gpt rank 2 pid ")
    for source in ranks:
        source.close()


_REPORTER = """
import sys
import time
from pathlib import Path
from pipefill.spec import FillJobPhase
from pipefill.spec.fillstatus import SliceProgress
from pipefill_fill.work import Slice
from pipefill_fill.sources import Identity, ProgressReport
from pipefill_fill.sources.files import FilesSource

rank, go = int(sys.argv[2]), Path(sys.argv[3])
source = FilesSource(Path(sys.argv[1]), identity=Identity("gpt", rank))
(spec,) = source.poll()
assert source.claim(spec, [Slice(64 * rank, 64 * rank + 64)]) is not None
while not go.exists():
    time.sleep(0.001)
lost = 0
for i in range(200):
    source.report("a", ProgressReport(FillJobPhase.RUNNING, committed=10 * rank + i, total=256))
    status = source.status("a")  # what this executor wrote must still be there, whatever the others wrote since
    want = [{"trainingJob": "gpt", "rank": rank, "start": 64 * rank, "end": 64 * rank + 64}]
    held = [{k: v for k, v in a.items() if k != "epoch"} for a in status["assignments"] if a["rank"] == rank]
    lost += status["samplesDone"] < 10 * rank + i or held != want
sys.exit(f"{lost} updates lost" if lost else 0)
"""


def test_files_source_status_loses_no_concurrent_update(jobs_dir: Path) -> None:
    write_job(jobs_dir, "a", total=256, max_parallel_ranks=4)
    go = jobs_dir / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", _REPORTER, str(jobs_dir), str(r), str(go)], env=subprocess_env())
        for r in range(4)
    ]

    def all_claimed() -> bool:
        assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
        return all((jobs_dir / "a.locks" / f"slice-{Slice(64 * r, 64 * r + 64).key}.lock").exists() for r in range(4))

    wait_for(all_claimed, "each reporter to claim its slice", 60, interval_s=0.01)
    go.touch()
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    status = FilesSource(jobs_dir, identity=ME).status("a")
    assert status["samplesDone"] == 30 + 199  # the largest reported, whoever wrote last
    assert [{k: v for k, v in a.items() if k != "epoch"} for a in status["assignments"]] == [
        {"trainingJob": "gpt", "rank": r, "start": 64 * r, "end": 64 * r + 64} for r in range(4)
    ]
    assert sorted(a["epoch"] for a in status["assignments"]) == [1, 2, 3, 4] and status["epoch"] == 4  # one each


def test_open_source_rejects_unknown_values() -> None:
    with pytest.raises(ValueError, match="PIPEFILL_WORK_SOURCE='s3://x': expected files:<dir> or kubernetes"):
        open_source("s3://x", identity=ME)
