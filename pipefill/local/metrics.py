"""One Prometheus endpoint for a local run: every child's ``/metrics`` under the names and labels a cluster would give.

In a cluster Prometheus scrapes each container's metrics port and the pod relabeling adds ``rank`` (from the pod
label ``pipefill.io/rank``) and ``container``. Locally each child serves its own port (``PIPEFILL_METRICS_PORT``);
``ChildrenCollector`` scrapes them all whenever it is scraped itself, parses them with prometheus_client's parser and
re-exposes every series with those two labels added, plus the runner's own ``pipefill_local_*`` (documented in
``docs/metrics.md``). A label a child sets itself is kept as the child set it (as with ``honor_labels``). A child that
is down (being restarted) or does not answer within ``timeout_s`` leaves its series out of that scrape and shows as
``pipefill_local_target_up 0``; the endpoint itself keeps answering.
"""

from __future__ import annotations

import http.client
import threading
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from pipefill.local.runner import RunOutcome

__all__ = ["ChildrenCollector", "MetricsEndpoint", "Target"]

_TARGET_LABELS = ("rank", "container")


class Target(Protocol):
    """A child with a metrics port (``LocalProcess``); port 0: it serves none."""

    rank: int
    container: str
    metrics_port: int


class ChildrenCollector(Collector):
    """Every child's series with ``rank`` and ``container`` added, and the runner's own metrics."""

    def __init__(
        self, targets: Callable[[], Sequence[Target]], *, outcome: RunOutcome | None = None, timeout_s: float = 2.0
    ) -> None:
        self._targets = targets
        self._outcome = outcome
        self.timeout_s = timeout_s
        """Seconds to wait for one child (they are scraped in parallel, so also about the longest a scrape takes)."""

    def collect(self) -> Iterable[Metric]:
        targets = [t for t in self._targets() if t.metrics_port]
        with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
            scraped = list(pool.map(self._scrape, targets))
        merged: dict[str, Metric] = {}
        up = GaugeMetricFamily(
            "pipefill_local_target_up", "1 if the child's metrics endpoint answered this scrape.", labels=_TARGET_LABELS
        )
        for target, families in zip(targets, scraped, strict=True):
            target_labels = {"rank": str(target.rank), "container": target.container}
            up.add_metric(list(target_labels.values()), 0.0 if families is None else 1.0)
            for family in families or []:
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                if into.type != family.type:
                    continue  # two children disagree on a name's type; the first one seen is kept
                for s in family.samples:
                    into.add_sample(s.name, {**target_labels, **s.labels}, s.value, s.timestamp, s.exemplar)
        yield from merged.values()
        yield up
        yield from self._own(targets)

    def _own(self, targets: list[Target]) -> Iterable[Metric]:
        outcome = self._outcome
        if outcome is None:
            return
        jobs = CounterMetricFamily(
            "pipefill_local_job_restarts", "Whole-job restarts from the checkpoints (a trainer failed retryably)."
        )
        jobs.add_metric([], outcome.job_restarts)
        yield jobs
        restarts = CounterMetricFamily(
            "pipefill_local_container_restarts",
            "Restarts of one container's process alone (a crashed fill executor; training goes on).",
            labels=_TARGET_LABELS,
        )
        counts = {(t.rank, t.container): 0 for t in targets}
        counts.update(list(outcome.process_restarts.items()))  # a copy: the runner's thread updates the dict
        for (rank, container), n in sorted(counts.items()):
            restarts.add_metric([str(rank), container], n)
        yield restarts

    def _scrape(self, target: Target) -> list[Metric] | None:
        """The child's families, or None when it is down, silent or answers garbage."""
        url = f"http://127.0.0.1:{target.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                text = resp.read().decode("utf-8", errors="replace")
            return list(text_string_to_metric_families(text))
        except (OSError, http.client.HTTPException, ValueError):
            return None


class MetricsEndpoint:
    """The HTTP endpoint on ``127.0.0.1:port`` (0: a free port) serving ``collector`` from its own registry."""

    def __init__(self, collector: ChildrenCollector, *, port: int) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        self.port: int = self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
