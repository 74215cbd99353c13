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
import sys
from urllib.parse import urlsplit

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from pipefill_operator.controller import Controller, OperatorConfig
from pipefill_operator.handlers import register
from pipefill_operator.kube import Kube, load_configuration
from pipefill_operator.metrics import OperatorMetrics

__all__ = ["main"]


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
    p.add_argument("--verbose", "-v", action="store_true", help="log kopf's own progress too")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("kopf").setLevel(logging.WARNING)
    if args.workers < 1 or args.status_interval <= 0:
        print("--workers must be >= 1 and --status-interval > 0", file=sys.stderr)
        return 2
    config = OperatorConfig(
        namespaces=tuple(args.namespace), workers=args.workers, status_interval_s=args.status_interval
    )
    registry = CollectorRegistry()
    host, _, port = args.metrics_address.rpartition(":")
    if not port.isdigit():
        print(f"--metrics-address {args.metrics_address!r}: expected host:port such as 127.0.0.1:9402", file=sys.stderr)
        return 2
    if int(port):
        start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    controller = Controller(Kube(load_configuration(args.kubeconfig)), OperatorMetrics(registry), config)
    kopf_registry = kopf.OperatorRegistry()
    register(controller, kopf_registry)
    if args.liveness and urlsplit(args.liveness).scheme not in ("http", "https"):
        print(f"--liveness {args.liveness!r}: expected a URL such as http://127.0.0.1:8080/healthz", file=sys.stderr)
        return 2
    asyncio.run(
        kopf.operator(
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
