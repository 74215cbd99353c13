"""Work sources: the files source (manifests, slice claims and seats by flock, status merged by concurrent writers in
real processes) and the Kubernetes source against a real HTTP server speaking the custom-objects API (what it lists,
the slice it claims, and the exact status patches it sends, with their resourceVersion precondition)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from fill_helpers import subprocess_env, write_job
from kubernetes import client

from pipefill.spec import FillJobPhase
from pipefill_fill.sources import Identity, ProgressReport, open_source
from pipefill_fill.sources.base import merged_status
from pipefill_fill.sources.files import FilesSource
from pipefill_fill.sources.kubernetes import KubernetesSource
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
    source.report("a", ProgressReport(FillJobPhase.RUNNING, committed=4, total=10, throughput_per_s=2.0))
    status = source.status("a")
    assert status["phase"] == "Running" and status["samplesDone"] == 4 and status["progress"] == 40.0
    assert status["assignments"] == [{"trainingJob": "gpt", "rank": 1, "start": 0, "end": 10}]
    assert "estimatedCompletionTime" in status
    source.report("a", ProgressReport(FillJobPhase.SUCCEEDED, committed=10, total=10))
    assert source.status("a")["assignments"] == [] and source.poll() == []


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
    lost += status["samplesDone"] < 10 * rank + i or [a for a in status["assignments"] if a["rank"] == rank] != want
sys.exit(f"{lost} updates lost" if lost else 0)
"""


def test_files_source_status_loses_no_concurrent_update(jobs_dir: Path) -> None:
    write_job(jobs_dir, "a", total=256, max_parallel_ranks=4)
    go = jobs_dir / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", _REPORTER, str(jobs_dir), str(r), str(go)], env=subprocess_env())
        for r in range(4)
    ]
    while not all((jobs_dir / "a.locks" / f"slice-{Slice(64 * r, 64 * r + 64).key}.lock").exists() for r in range(4)):
        assert all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    status = FilesSource(jobs_dir, identity=ME).status("a")
    assert status["samplesDone"] == 30 + 199  # the largest reported, whoever wrote last
    assert status["assignments"] == [
        {"trainingJob": "gpt", "rank": r, "start": 64 * r, "end": 64 * r + 64} for r in range(4)
    ]


def test_merged_status_rules() -> None:
    me, other = Identity("gpt", 0), Identity("gpt", 1)
    running = ProgressReport(FillJobPhase.RUNNING, committed=50, total=100, start_time="2026-01-01T00:00:00Z")
    first = merged_status({}, running, identity=other, held=[Slice(0, 50)])
    assert first is not None and first["samplesDone"] == 50
    older = ProgressReport(FillJobPhase.RUNNING, committed=40, total=100, start_time="2026-02-02T00:00:00Z")
    second = merged_status(first, older, identity=me, held=[Slice(50, 100)])
    assert second is not None and second["samplesDone"] == 50 and second["startTime"] == "2026-01-01T00:00:00Z"
    assert [(a["rank"], a["start"]) for a in second["assignments"]] == [(1, 0), (0, 50)]
    takeover = merged_status(second, running, identity=me, held=[Slice(0, 50)])  # rank 1 died holding [0, 50)
    assert takeover is not None and [(a["rank"], a["start"]) for a in takeover["assignments"]] == [(0, 0)]
    queued = ProgressReport(FillJobPhase.QUEUED, committed=50, total=100, message="nothing fits")
    still = merged_status(second, queued, identity=me, held=[])
    assert still is not None and still["phase"] == "Running" and still["message"] == "nothing fits"
    done = merged_status(second, ProgressReport(FillJobPhase.SUCCEEDED, committed=100, total=100), identity=me, held=[])
    assert done is not None and done["phase"] == "Succeeded" and done["assignments"] == []
    assert merged_status(done, running, identity=other, held=[Slice(0, 50)]) is None  # a final phase stays


def test_open_source_rejects_unknown_values() -> None:
    with pytest.raises(ValueError, match="PIPEFILL_WORK_SOURCE='s3://x': expected files:<dir> or kubernetes"):
        open_source("s3://x", identity=ME)


class _Api(BaseHTTPRequestHandler):
    """The custom-objects API of FillJobs: list, get, and merge-patch of status with the resourceVersion precondition.
    ``race``: status fields another pod patches in just before each of the next PATCHes arrives."""

    items: ClassVar[list[dict[str, Any]]] = []
    patches: ClassVar[list[tuple[str, str, dict[str, Any]]]] = []
    race: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        obj = self._object()
        self._send(obj if obj is not None else {"kind": "FillJobList", "items": self.items})

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.patches.append((self.path, self.headers["Content-Type"], body))
        obj = self._object()
        assert obj is not None
        if self.race:
            self._apply(obj, self.race.pop(0))
        if body.get("metadata", {}).get("resourceVersion") not in (None, obj["metadata"]["resourceVersion"]):
            self._send({"kind": "Status", "code": 409, "reason": "Conflict"}, code=409)
            return
        self._send(self._apply(obj, body["status"]))

    def _object(self) -> dict[str, Any] | None:
        parts = self.path.split("?")[0].split("/")
        if "filljobs" not in parts or parts[-1] == "filljobs":
            return None
        name = parts[parts.index("filljobs") + 1]
        return next(o for o in self.items if o["metadata"]["name"] == name)

    @staticmethod
    def _apply(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        obj["status"].update(status)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return obj

    def _send(self, obj: dict[str, Any], code: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def api() -> Iterator[client.CustomObjectsApi]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cfg = client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    with client.ApiClient(cfg) as api_client:
        yield client.CustomObjectsApi(api_client)
    server.shutdown()
    server.server_close()
    thread.join()


def _filljob(name: str, assignments: list[dict[str, Any]], phase: str = "Running", total: int = 100) -> dict[str, Any]:
    return {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "FillJob",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {
            "workload": {"kind": "inference", "builtin": "encoder-inference"},
            "output": {"path": f"/data/{name}"},
            "totalSamples": total,
            "maxParallelRanks": 2,
        },
        "status": {"phase": phase, "assignments": assignments},
    }


def test_kubernetes_source_lists_assigned_jobs_and_claims_their_slice(api: client.CustomObjectsApi) -> None:
    mine = {"trainingJob": "gpt", "rank": 1, "start": 0, "end": 100}
    _Api.items = [
        _filljob("mine", [mine]),
        _filljob("split", [{**mine, "rank": 0, "end": 64}, {**mine, "start": 64, "end": 128}], total=256),
        _filljob("other-rank", [{**mine, "rank": 0}]),
        _filljob("finished", [mine], phase="Succeeded"),
        _filljob("unassigned", []),
    ]
    source = KubernetesSource(identity=ME, namespace="ns", api=api)
    specs = {s.name: s for s in source.poll()}
    assert sorted(specs) == ["mine", "split"]
    assert source.acquire("mine")  # the whole job, as assigned
    slices = [Slice(0, 64), Slice(64, 128), Slice(128, 192), Slice(192, 256)]
    assert source.claim(specs["split"], slices) == Slice(64, 128)
    assert source.claim(specs["split"], [Slice(128, 192)]) is None  # its slice is done: the operator moves it on


def test_kubernetes_source_merges_status_and_retries_a_conflict(api: client.CustomObjectsApi) -> None:
    _Api.items = [_filljob("mine", [{"trainingJob": "gpt", "rank": 1, "start": 0, "end": 64}], total=256)]
    _Api.patches = []
    _Api.race = [{"samplesDone": 60}]  # another pod's report lands between this one's read and its patch
    source = KubernetesSource(identity=ME, namespace="ns", api=api)
    source.report(
        "mine", ProgressReport(FillJobPhase.RUNNING, committed=25, total=256, start_time="2026-01-01T00:00:00Z")
    )
    (path, content_type, refused), (_, _, body) = _Api.patches
    assert path == "/apis/pipefill.io/v1alpha1/namespaces/ns/filljobs/mine/status"
    assert content_type == "application/merge-patch+json"
    assert refused["metadata"] == {"resourceVersion": "1"} and refused["status"]["samplesDone"] == 25
    assert body == {
        "metadata": {"resourceVersion": "2"},
        "status": {"phase": "Running", "samplesDone": 60, "progress": 23.438, "startTime": "2026-01-01T00:00:00Z"},
    }
    assert _Api.items[0]["status"]["assignments"] == [{"trainingJob": "gpt", "rank": 1, "start": 0, "end": 64}]
    _Api.patches = []
    source.report("mine", ProgressReport(FillJobPhase.SUCCEEDED, committed=256, total=256))
    source.report("mine", ProgressReport(FillJobPhase.RUNNING, committed=200, total=256))  # a late report
    assert [b["status"]["phase"] for _, _, b in _Api.patches] == ["Succeeded"]
