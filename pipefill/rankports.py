"""The ports a rank pod listens on: its trainer's and its fill executor's metrics, and rank 0's rendezvous
(``MASTER_PORT``), the same for a pod and for ``pipefill local`` (which gives its processes free ports instead).

On the pod network each pod has ports of its own, so every rank pod uses the same numbers. Under
``spec.podTemplate.hostNetwork`` the pods share the node's ports with each other and with whatever else runs on the
node, so each rank takes its own (declared as host ports: the scheduler never puts two pods needing one port on one
node): the rendezvous at ``hostPortBase``, then a trainer and a fill-executor port per rank above it. The default base,
29500 (torch's rendezvous port), keeps them clear of the ports node agents listen on (the DCGM exporter's 9400, the
node exporter's 9100, the operator's metrics 9402) and under Linux's ephemeral range (from 32768), whose ports the
kernel hands to outgoing connections; where something on the nodes holds one anyway, ``hostPortBase`` moves them
(docs/operator.md, "Ports").
"""

from __future__ import annotations

from dataclasses import dataclass

from pipefill.spec import PipelineTrainingJob

__all__ = [
    "DEFAULT_HOST_PORT_BASE",
    "FILL_METRICS_PORT",
    "HOST_PORT_SLOTS",
    "MASTER_PORT",
    "TRAINER_METRICS_PORT",
    "RankPorts",
    "rank_ports",
]

MASTER_PORT = 29500
TRAINER_METRICS_PORT = 9400
FILL_METRICS_PORT = 9401
DEFAULT_HOST_PORT_BASE = 29500
HOST_PORT_SLOTS = 512
"""Ranks with ports of their own under hostNetwork; rank r takes slot r mod this (ranks 512 apart never share a node:
their host ports are the same)."""


@dataclass(frozen=True)
class RankPorts:
    trainer_metrics: int
    fill_metrics: int
    rendezvous: int
    """rank 0's, where every rank's MASTER_PORT points"""


def rank_ports(job: PipelineTrainingJob, rank: int) -> RankPorts:
    """The ports of ``rank``'s pod."""
    template = job.spec.pod_template
    if not template.host_network:
        return RankPorts(TRAINER_METRICS_PORT, FILL_METRICS_PORT, MASTER_PORT)
    base = DEFAULT_HOST_PORT_BASE if template.host_port_base is None else template.host_port_base
    slot = rank % HOST_PORT_SLOTS
    return RankPorts(base + 1 + 2 * slot, base + 2 + 2 * slot, base)
