"""Status that only the ranks know — the step, the bubble fraction, the fill utilization — read from their metrics.

The trainer never talks to the API server; the operator scrapes each running rank pod's trainer and fill-executor
metrics endpoints (the pod IP and the ports named ``trainer-metrics`` and ``fill-metrics`` in the pod spec) at a
bounded rate: each job at most once per ``interval_s``, at most ``concurrency`` scrapes at a time, each cut off
after ``timeout_s``. :func:`job_figures` turns the samples into the status fields (step, bubble fraction, fill utilization, loss), and
:func:`job_progress` into the percent done and the estimated completion (against ``spec.steps``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["JobFigures", "StatusReader", "job_figures", "job_progress", "metric_sums", "paced", "scrape_targets"]

STEP = "pipefill_trainer_step"
STEP_SECONDS_SUM = "pipefill_trainer_step_seconds_sum"
STEP_SECONDS_COUNT = "pipefill_trainer_step_seconds_count"
LOSS = "pipefill_trainer_loss"
BUBBLE_SECONDS = "pipefill_trainer_bubble_seconds_total"
FILL_RECOVERY = "pipefill_fill_bubble_recovery_ratio"
_PORTS = {"trainer-metrics": "trainer", "fill-metrics": "fill"}


@dataclass(frozen=True)
class JobFigures:
    """The status fields read from the ranks; None where no rank reported it yet."""

    current_step: int | None
    bubble_fraction: float | None
    fill_utilization: float | None
    loss: float | None = None
    step_seconds: float | None = None  # mean step time of the slowest rank since its trainer started


def job_progress(figures: JobFigures, steps: int | None, now_s: float) -> tuple[float | None, float | None]:
    """(percent of ``steps`` done, estimated completion as a Unix time) from the ranks' figures; None where the
    ranks have not said enough yet (no step done, no step time)."""
    if figures.current_step is None or not steps:
        return None, None
    percent = round(min(100.0, 100.0 * figures.current_step / steps), 2)
    if figures.step_seconds is None:
        return percent, None
    return percent, now_s + max(0, steps - figures.current_step) * figures.step_seconds


def metric_sums(text: str) -> dict[str, float]:
    """Every sample name of a Prometheus text exposition, summed over its label sets."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return sums


def job_figures(trainers: Sequence[dict[str, float]], fills: Sequence[dict[str, float]]) -> JobFigures:
    """Aggregate per-rank samples: the step all ranks completed (the minimum), the mean idle fraction of step time,
    the mean fill busy ÷ offered time."""
    steps = [int(t[STEP]) for t in trainers if STEP in t]
    fractions = [
        min(1.0, t.get(BUBBLE_SECONDS, 0.0) / t[STEP_SECONDS_SUM]) for t in trainers if t.get(STEP_SECONDS_SUM, 0.0) > 0
    ]
    recoveries = [f[FILL_RECOVERY] for f in fills if FILL_RECOVERY in f]
    # every rank knows the step's loss (the step-end all-reduce): one value, whichever rank is read
    losses = [t[LOSS] for t in trainers if LOSS in t and t.get(STEP_SECONDS_COUNT, 0.0) > 0]
    means = [t[STEP_SECONDS_SUM] / t[STEP_SECONDS_COUNT] for t in trainers if t.get(STEP_SECONDS_COUNT, 0.0) > 0]
    return JobFigures(
        current_step=min(steps) if steps else None,
        bubble_fraction=round(sum(fractions) / len(fractions), 4) if fractions else None,
        fill_utilization=round(sum(recoveries) / len(recoveries), 4) if recoveries else None,
        loss=round(max(losses), 4) if losses else None,
        step_seconds=max(means) if means else None,
    )


T = TypeVar("T")


async def paced(items: Iterable[T], cost: Callable[[T], int], rate: float) -> AsyncIterator[T]:
    """``items`` in order, each once the costs of those before it are due at ``rate`` per second (its own cost is
    taken at its turn): the first at once, the next after cost(first) ÷ rate seconds, and so on."""
    loop = asyncio.get_running_loop()
    began, spent = loop.time(), 0
    for item in items:
        due = began + spent / rate - loop.time()
        if due > 0:
            await asyncio.sleep(due)
        spent += cost(item)
        yield item


def scrape_targets(pods: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(container kind, URL) of each running pod's metrics endpoints, from its IP and its named ports."""
    targets = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or (pod.get("status") or {}).get("phase") != "Running":
            continue
        spec = pod.get("spec") or {}
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for port in container.get("ports") or ():
                kind = _PORTS.get(port.get("name", ""))
                if kind is not None:
                    host = f"[{ip}]" if ":" in ip else ip
                    targets.append((kind, f"http://{host}:{port['containerPort']}/metrics"))
    return targets


class StatusReader:
    """Scrapes endpoints with bounded concurrency and timeouts; a target that does not answer is left out."""

    def __init__(self, *, timeout_s: float = 2.0, concurrency: int = 16) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._limit = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _scrape(self, url: str) -> dict[str, float] | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._limit:
            try:
                async with self._session.get(url) as response:
                    if response.status != 200:
                        return None
                    return metric_sums(await response.text())
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return None

    async def read(self, pods: Iterable[dict[str, Any]]) -> tuple[JobFigures, int, int]:
        """(figures, endpoints answered, endpoints failed) of one job's running pods."""
        targets = scrape_targets(pods)
        results = await asyncio.gather(*(self._scrape(url) for _, url in targets))
        trainers = [r for (kind, _), r in zip(targets, results, strict=True) if kind == "trainer" and r is not None]
        fills = [r for (kind, _), r in zip(targets, results, strict=True) if kind == "fill" and r is not None]
        failed = sum(1 for r in results if r is None)
        return job_figures(trainers, fills), len(results) - failed, failed
