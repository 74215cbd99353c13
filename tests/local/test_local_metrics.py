"""The aggregated metrics endpoint of `pipefill local`: every child's series with rank and container labels, real
HTTP against real processes, and a scrape that survives children that are down or silent."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import launched
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_local_run import _job
from waiting import wait_for

from pipefill.events import StepEvent, read_events
from pipefill.local.metrics import ChildrenCollector, MetricsEndpoint
from pipefill.local.procs import LocalProcess, free_port
from pipefill.local.runner import RunOutcome

LOCAL = [sys.executable, "-m", "pipefill", "local"]
# A child serving one counter with a label of its own and a `rank` label it sets itself.
CHILD = """
import sys, time
from prometheus_client import CollectorRegistry, Counter, start_http_server
registry = CollectorRegistry()
Counter("pipefill_fill_items_total", "Units of work done.", ["fill_job", "rank"], registry=registry).labels("j", "7").inc(3)
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=registry)
time.sleep(300)
"""


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200
        body: bytes = resp.read()
    return body.decode()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _labels(**kw: str) -> frozenset[tuple[str, str]]:
    return frozenset(kw.items())


@pytest.fixture
def child(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(port)])
    wait_for(lambda: _listening(port), f"a child listening on {port}")
    yield proc, port
    proc.kill()
    proc.wait()


def test_a_down_or_silent_child_leaves_out_its_series_and_the_scrape_still_answers(
    tmp_path: Path, child: tuple[subprocess.Popen[bytes], int]
) -> None:
    _, live_port = child
    down_port = free_port()  # nothing listens: a fill executor being restarted
    silent = socket.socket()  # accepts connections and never answers: a stopped process
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    targets = [
        LocalProcess(0, "fill-executor", [], {}, tmp_path, live_port),
        LocalProcess(1, "fill-executor", [], {}, tmp_path, down_port),
        LocalProcess(1, "trainer", [], {}, tmp_path, silent.getsockname()[1]),
    ]
    outcome = RunOutcome(code=1, reason="running", job_restarts=1, process_restarts={(1, "fill-executor"): 2})
    endpoint = MetricsEndpoint(ChildrenCollector(lambda: targets, outcome=outcome, timeout_s=0.5), port=0)
    try:
        text = _get(endpoint.url)
        samples = _samples(text)
        # the child's own `rank` label is kept, not duplicated or overwritten; `container` is added
        assert samples[("pipefill_fill_items_total", _labels(fill_job="j", rank="7", container="fill-executor"))] == 3.0
        assert text.count('pipefill_fill_items_total{container="fill-executor",fill_job="j",rank="7"}') == 1
        up = {k[1]: v for k, v in samples.items() if k[0] == "pipefill_local_target_up"}
        assert up == {
            _labels(rank="0", container="fill-executor"): 1.0,
            _labels(rank="1", container="fill-executor"): 0.0,
            _labels(rank="1", container="trainer"): 0.0,
        }
        assert samples[("pipefill_local_job_restarts_total", frozenset())] == 1.0
        restarts = _labels(rank="1", container="fill-executor")
        assert samples[("pipefill_local_container_restarts_total", restarts)] == 2.0
        assert samples[("pipefill_local_container_restarts_total", _labels(rank="1", container="trainer"))] == 0.0
        # the restarted child is back on its port: its series return with the next scrape
        back = subprocess.Popen([sys.executable, "-c", CHILD, str(down_port)])
        try:

            def back_up() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
                got = _samples(_get(endpoint.url))
                return got if got.get(("pipefill_local_target_up", restarts)) == 1.0 else None

            samples = wait_for(back_up, "the restarted child's series", interval_s=0.1)
            items = _labels(fill_job="j", rank="7", container="fill-executor")
            assert samples[("pipefill_local_target_up", _labels(rank="1", container="fill-executor"))] == 1.0
            assert samples[("pipefill_fill_items_total", items)] == 3.0
        finally:
            back.kill()
            back.wait()
    finally:
        endpoint.close()
        silent.close()


@pytest.mark.busy  # pipefill local: heavy, untimed (tests/sharing.py)
@pytest.mark.slow
def test_endpoint_during_a_tiny_run_serves_both_ranks_trainer_and_fill_series(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [*LOCAL, "-f", str(_job(tmp_path, steps=100000, fill=True)), "--out", str(out), "--metrics-port", "0",
            "--no-timeline"]  # fmt: skip
    proc = launched.popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:  # the URL is printed before any process starts
            if "/metrics" in line:
                url = line.split()[-1]
                break
        assert url.startswith("http://127.0.0.1:"), url
        events = out / "ranks" / "1" / "trainer" / "events.jsonl"
        wait_for(lambda: sum(isinstance(e, StepEvent) for e in read_events(events)) >= 3, "3 steps", timeout_s=90)

        def all_up() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
            got = _samples(_get(url))  # a fill executor may be down for a moment (being restarted): scrape again
            up = [v for (name, _), v in got.items() if name == "pipefill_local_target_up"]
            return got if len(up) == 4 and all(up) else None

        samples = wait_for(all_up, "every process's metrics", timeout_s=60, interval_s=0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    for rank in ("0", "1"):
        trainer = _labels(rank=rank, container="trainer")
        fill = _labels(rank=rank, container="fill-executor")
        assert samples[("pipefill_trainer_steps_total", trainer)] >= 1
        assert ("pipefill_trainer_step_seconds_count", trainer) in samples
        assert ("pipefill_trainer_bubble_seconds_total", _labels(kind="steady", **dict(trainer))) in samples
        assert ("pipefill_fill_bubbles_seen_total", fill) in samples
        assert samples[("pipefill_fill_memory_budget_bytes", fill)] > 0
        assert samples[("pipefill_local_target_up", trainer)] == 1.0
        assert samples[("pipefill_local_target_up", fill)] == 1.0
    assert samples[("pipefill_local_job_restarts_total", frozenset())] == 0.0
    assert "interrupted" in output
