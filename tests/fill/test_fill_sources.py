"""Work sources: the files source (manifests, status files, ownership by flock) and the Kubernetes source against a
real HTTP server speaking the custom-objects API (what it lists, and the exact status patch it sends)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from fill_helpers import write_job
from kubernetes import client
from pipefill_fill.sources import Identity, ProgressReport, open_source
from pipefill_fill.sources.files import FilesSource
from pipefill_fill.sources.kubernetes import KubernetesSource

from pipefill.spec import FillJobPhase

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
    source.report("a", ProgressReport(FillJobPhase.RUNNING, committed=4, total=10, throughput_per_s=2.0))
    status = source.status("a")
    assert status["phase"] == "Running" and status["samplesDone"] == 4 and status["progress"] == 40.0
    assert status["assignments"] == [{"trainingJob": "gpt", "rank": 1, "start": 0, "end": 10}]
    assert "estimatedCompletionTime" in status
    source.report("a", ProgressReport(FillJobPhase.SUCCEEDED, committed=10, total=10))
    assert source.poll() == []


def test_files_source_one_owner_at_a_time(jobs_dir: Path) -> None:
    write_job(jobs_dir, "a")
    first = FilesSource(jobs_dir, identity=ME)
    second = FilesSource(jobs_dir, identity=Identity("gpt", 2))
    assert first.acquire("a") and first.acquire("a")
    assert not second.acquire("a")
    first.release("a")
    assert second.acquire("a")
    second.close()


def test_open_source_rejects_unknown_values() -> None:
    with pytest.raises(ValueError, match="PIPEFILL_WORK_SOURCE='s3://x': expected files:<dir> or kubernetes"):
        open_source("s3://x", identity=ME)


class _Api(BaseHTTPRequestHandler):
    items: ClassVar[list[dict[str, Any]]] = []
    patches: ClassVar[list[tuple[str, str, dict[str, Any]]]] = []

    def do_GET(self) -> None:
        self._send({"apiVersion": "pipefill.io/v1alpha1", "kind": "FillJobList", "items": self.items})

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.patches.append((self.path, self.headers["Content-Type"], body))
        self._send(body)

    def _send(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
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


def _filljob(name: str, assignments: list[dict[str, Any]], phase: str = "Running") -> dict[str, Any]:
    return {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "FillJob",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "workload": {"kind": "inference", "builtin": "encoder-inference"},
            "output": {"path": f"/data/{name}"},
            "totalSamples": 100,
        },
        "status": {"phase": phase, "assignments": assignments},
    }


def test_kubernetes_source_lists_assigned_jobs_and_patches_status(api: client.CustomObjectsApi) -> None:
    mine = {"trainingJob": "gpt", "rank": 1, "start": 0, "end": 100}
    _Api.items = [
        _filljob("mine", [mine]),
        _filljob("other-rank", [{**mine, "rank": 0}]),
        _filljob("finished", [mine], phase="Succeeded"),
        _filljob("unassigned", []),
    ]
    _Api.patches = []
    source = KubernetesSource(identity=ME, namespace="ns", api=api)
    assert [s.name for s in source.poll()] == ["mine"]
    assert source.acquire("mine")
    source.report(
        "mine", ProgressReport(FillJobPhase.RUNNING, committed=25, total=100, start_time="2026-01-01T00:00:00Z")
    )
    ((path, content_type, body),) = _Api.patches
    assert path == "/apis/pipefill.io/v1alpha1/namespaces/ns/filljobs/mine/status"
    assert content_type == "application/merge-patch+json"
    assert body == {
        "status": {"phase": "Running", "samplesDone": 25, "progress": 25.0, "startTime": "2026-01-01T00:00:00Z"}
    }
