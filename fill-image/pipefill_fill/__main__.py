"""``python -m pipefill_fill``: the fill executor of one rank, configured by the environment contract.

Reads PIPEFILL_CHANNEL_DIR, PIPEFILL_WORK_SOURCE, PIPEFILL_JOB_NAME, PIPEFILL_RANK, PIPEFILL_FILL_RESERVED_BYTES,
PIPEFILL_FILL_MIN_BUBBLE_MS, PIPEFILL_FILL_GUARD_MS, PIPEFILL_FILL_END_QUANTILE, PIPEFILL_FILL_OVERRUN_BUDGET_US,
PIPEFILL_FILL_OFFLOAD,
PIPEFILL_FILL_SPIN_US, PIPEFILL_FILL_CPU_PRIORITY, PIPEFILL_DEVICE, PIPEFILL_CPU_AFFINITY, PIPEFILL_METRICS_PORT and PIPEFILL_OUT_DIR (docs/fill.md). Exits 0 when the trainer is gone or on SIGTERM, after
committing what is done; 2 when the configuration can never work.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Protocol

import torch
from prometheus_client import CollectorRegistry, start_http_server

from pipefill import env
from pipefill.events import FILL_EVENTS, EventWriter, StartEvent
from pipefill.parent import stop_with_parent
from pipefill_fill.attach import attach
from pipefill_fill.device import cap_memory, idle_priority, memory_in_use, pin_cpus, select_device
from pipefill_fill.metrics import FillMetrics
from pipefill_fill.runner import Attached, Runner
from pipefill_fill.settings import Settings
from pipefill_fill.sources import Identity, open_source

log = logging.getLogger("pipefill_fill")


class _Runner(Protocol):
    def run(self) -> int: ...


def main(runner_cls: Callable[[Attached], _Runner] = Runner) -> int:
    """Attach, set up and run the fill executor; ``runner_cls`` runs the work (the default: bubbles only)."""
    logging.basicConfig(
        level=os.environ.get(env.LOG_LEVEL, "INFO"),
        format="%(asctime)s fill-executor %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    stop_with_parent()  # started by pipefill local: ends with it (a no-op in a container)
    try:
        settings = Settings.from_env()
        cpus = pin_cpus(settings.cpu_affinity)
        idle = settings.cpu_idle and idle_priority()
        if cpus is None:
            torch.set_num_threads(max(1, min(torch.get_num_threads(), env.env_int("OMP_NUM_THREADS", 1))))
    except ValueError as exc:
        log.error("invalid configuration: %s", exc)
        return env.EXIT_INVALID_CONFIG
    link = attach(settings.channel_dir)
    link.consumer.set_spin(settings.spin_s)
    try:
        device = select_device(settings.device, link.gpu_uuids)
        fraction = cap_memory(device, settings.reserved_bytes)
        identity = Identity(
            settings.training_job or link.job_name,
            settings.rank,
            pod=os.environ.get("HOSTNAME") or None,
            pod_uid=os.environ.get(env.POD_UID) or None,
        )
        source = open_source(settings.work_source, identity=identity)
    except ValueError as exc:
        log.error("invalid configuration: %s", exc)
        link.close()
        return env.EXIT_INVALID_CONFIG
    registry = CollectorRegistry()
    metrics = FillMetrics(registry)
    metrics.memory_budget_bytes.set(settings.reserved_bytes)
    try:
        metrics.watch_memory(memory_in_use(device))
    except OSError as exc:  # no /proc/self/status: the gauge stays NaN
        log.warning("the fill's memory in use cannot be measured here: %s", exc)
    if settings.metrics_port > 0:
        start_http_server(settings.metrics_port, registry=registry)
    events = EventWriter(settings.out_dir / FILL_EVENTS if settings.out_dir is not None else None)
    events.write(
        StartEvent(
            device=str(device),
            cpus=sorted(cpus) if cpus else None,
            cpu_priority="idle" if idle else "normal",
            memory_budget_bytes=settings.reserved_bytes,
            memory_fraction=fraction,
            guard_s=settings.guard_s,
            training_job=identity.training_job,
            rank=identity.rank,
        )
    )
    log.info(
        "attached to %s (job %s rank %d) on %s, budget %d bytes, guard %.2f ms",
        settings.channel_dir,
        identity.training_job,
        identity.rank,
        device,
        settings.reserved_bytes,
        settings.guard_s * 1e3,
    )
    runner = runner_cls(
        Attached(link=link, source=source, device=device, settings=settings, metrics=metrics, events=events)
    )
    try:
        return runner.run()
    finally:
        events.close()
        link.close()


if __name__ == "__main__":
    sys.exit(main())
