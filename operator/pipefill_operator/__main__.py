"""``python -m pipefill_operator``: run the operator against the current kubeconfig or the in-cluster config.

All namespaces by default; ``--namespace NS`` (repeatable) serves only those. Then the operator needs its namespaced
permissions in each of them and, cluster-wide, only ``get`` on DRA DeviceClasses (the ``dra`` prerequisite check);
it neither watches nor lists nodes, so it skips the check that some node offers the GPU resource (the chart's
namespaced Roles, docs/operations.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from urllib.parse import urlsplit

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from pipefill import env
from pipefill.queue import POLICIES
from pipefill_operator.cache import ClusterCache
from pipefill_operator.controller import Controller, OperatorConfig
from pipefill_operator.fillqueue import FillQueue, QueueConfig
from pipefill_operator.handlers import register
from pipefill_operator.kube import Kube, load_configuration
from pipefill_operator.metrics import FillQueueMetrics, OperatorMetrics

POLICY_ENV = "PIPEFILL_OPERATOR_POLICY"

__all__ = ["POLICY_ENV", "exit_noise", "main"]

log = logging.getLogger("pipefill_operator")


def exit_noise(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """The event loop's exception handler: everything goes to asyncio's default handler (an ERROR in the log) except
    one known artefact of kopf 1.45 at exit. Stopping (SIGTERM), kopf cancels its watchers without closing their watch
    streams; asyncio then closes each ``infinite_watch`` generator as the loop shuts down, and when that happens while
    one was suspended mid-event, kopf's ``streaming_block`` fails with "generator didn't stop after athrow()" (about one
    stop in four with events in flight). The process is exiting and the stream held nothing to lose, so this is said
    at INFO, not as an ERROR a log alert or ``pipefill bench operator`` would count."""
    gen, exc = context.get("asyncgen"), context.get("exception")
    if (
        getattr(gen, "__name__", "") == "infinite_watch"
        and isinstance(exc, RuntimeError)
        and "didn't stop after athrow" in str(exc)
    ):
        log.info("a kopf watch stream did not close cleanly at exit (%s; harmless: the operator is stopping)", exc)
        return
    loop.default_exception_handler(context)


async def _operate(**kwargs: object) -> None:
    asyncio.get_running_loop().set_exception_handler(exit_noise)  # in force through asyncio.run's shutdown too
    await kopf.operator(**kwargs)  # type: ignore[arg-type]


def _parser() -> argparse.ArgumentParser:
    defaults = OperatorConfig()
    p = argparse.ArgumentParser(prog="python -m pipefill_operator", description=__doc__)
    p.add_argument("--kubeconfig", help="kubeconfig file; default $KUBECONFIG, ~/.kube/config, then in-cluster")
    p.add_argument("--namespace", "-n", action="append", default=[], help="serve only this namespace (repeatable)")
    p.add_argument("--workers", type=int, default=defaults.workers, help="reconciles at once (default %(default)s)")
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1:9402",
        help="host:port of /metrics; port 0 disables (default %(default)s)",
    )
    p.add_argument("--liveness", metavar="URL", help="kopf's liveness endpoint, e.g. http://127.0.0.1:8080/healthz")
    p.add_argument(
        "--status-interval",
        type=float,
        default=defaults.status_interval_s,
        metavar="SECONDS",
        help="read each running job's rank metrics this often (default %(default)s)",
    )
    p.add_argument(
        "--status-rate",
        type=float,
        default=defaults.status_rate,
        metavar="PER_SECOND",
        help="read at most this many rank metrics endpoints a second, over all jobs (default %(default)s)",
    )
    p.add_argument(
        "--policy",
        default=os.environ.get(POLICY_ENV) or "fifo",
        help=f"FillJob queue policy: {', '.join(POLICIES)} (docs/fill.md); default ${POLICY_ENV}, else %(default)s",
    )
    p.add_argument(
        "--fill-period",
        type=float,
        default=QueueConfig.period_s,
        metavar="SECONDS",
        help="a FillJob scheduling pass at least this often (default %(default)s)",
    )
    p.add_argument(
        "--admission-warnings",
        action="store_true",
        help="the chart's ValidatingAdmissionPolicy warns at apply time of a job without a checkpoint claim: record "
        "it in the job's condition without an Event (the chart sets this when it installs the policy)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="log kopf's own progress too")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("kopf").setLevel(logging.WARNING)
    if args.workers < 1 or args.status_interval <= 0 or args.fill_period <= 0 or args.status_rate <= 0:
        print("--workers must be >= 1, --status-interval, --status-rate and --fill-period > 0", file=sys.stderr)
        return 2
    config = OperatorConfig(
        namespaces=tuple(args.namespace),
        workers=args.workers,
        status_interval_s=args.status_interval,
        status_rate=args.status_rate,
        admission_warnings=args.admission_warnings,
    )
    try:
        queue_config = QueueConfig(
            policy=args.policy,
            period_s=args.fill_period,
            max_jobs_per_rank=env.fill_max_active_jobs(),
            namespaces=config.namespaces,
        )
    except ValueError as exc:
        print(f"--policy/${POLICY_ENV}: {exc}" if "policy" in str(exc) else str(exc), file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    host, _, port = args.metrics_address.rpartition(":")
    if not port.isdigit():
        print(f"--metrics-address {args.metrics_address!r}: expected host:port such as 127.0.0.1:9402", file=sys.stderr)
        return 2
    if int(port):
        start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    kube = Kube(load_configuration(args.kubeconfig))
    cache = ClusterCache(kube, namespaces=config.namespaces)  # one cache of pods and jobs for both loops
    fill = FillQueue(kube, FillQueueMetrics(registry), queue_config, cache=cache)
    controller = Controller(kube, OperatorMetrics(registry), config, fill=fill, cache=cache)
    log.info("fill queue: policy %s, %d fill jobs per rank", queue_config.policy, queue_config.max_jobs_per_rank)
    kopf_registry = kopf.OperatorRegistry()
    register(controller, kopf_registry)
    if args.liveness and urlsplit(args.liveness).scheme not in ("http", "https"):
        print(f"--liveness {args.liveness!r}: expected a URL such as http://127.0.0.1:8080/healthz", file=sys.stderr)
        return 2
    asyncio.run(
        _operate(
            registry=kopf_registry,
            standalone=True,
            clusterwide=config.clusterwide,
            namespaces=config.namespaces,
            liveness_endpoint=args.liveness,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
