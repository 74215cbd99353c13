"""Simulated GPU nodes: kwok's configuration, the stages that play the kubelet, and the Node objects.

kwok (Kubernetes WithOut Kubelet) watches the nodes and pods it manages and moves their status through *stages*
(selectors over the object, and the status to write next). The stages here play the parts of a kubelet our tests
rely on and nothing else: a node becomes Ready with its GPU capacity; a pod bound to a node becomes Running with an
IP (containers and native sidecars running); a deleted pod goes away. Pods never finish on their own: tests end a
container by patching its status, as a kubelet would report it. Every address is on loopback: nodes get
127.0.2.N, pods come from 127.1.0.0/16.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GPUS_PER_NODE",
    "GPU_PRODUCT",
    "GPU_RESOURCE",
    "MANUAL_KUBELET",
    "NODE_LABEL_SELECTOR",
    "POD_CIDR",
    "kwok_config",
    "node_ip",
    "node_manifest",
]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPUS_PER_NODE = 8
NODE_LABEL_SELECTOR = "type=kwok"
POD_CIDR = "127.1.0.0/16"
_NODE_IP_ANNOTATION = "pipefill.io/node-ip"
_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}


def node_ip(index: int) -> str:
    """Node ``index``'s InternalIP: 127.0.2.N (up to 65 000 nodes over 127.0.x.y, x ≥ 2)."""
    return f"127.0.{2 + index // 250}.{1 + index % 250}"


def node_manifest(index: int, *, tainted: bool = False, gpus: int = GPUS_PER_NODE) -> dict[str, Any]:
    """The Node ``kwok-node-<index>``, labelled like a GPU node; ``tainted`` marks a dedicated GPU node."""
    spec: dict[str, Any] = {}
    if tainted:
        spec["taints"] = [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"kwok-node-{index}",
            "annotations": {"kwok.x-k8s.io/node": "fake", _NODE_IP_ANNOTATION: node_ip(index)},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": f"kwok-node-{index}",
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/agent": "",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": spec,
        "status": {"capacity": {**_CAPACITY, GPU_RESOURCE: str(gpus)}},
    }


_NODE_READY = """\
{{ $now := Now }}
{{ $ip := index .metadata.annotations "pipefill.io/node-ip" }}
conditions:
{{ range $type, $status := dict "Ready" "True" "MemoryPressure" "False" "DiskPressure" "False" "PIDPressure" "False" "NetworkUnavailable" "False" }}
- type: {{ $type }}
  status: {{ $status | Quote }}
  reason: {{ printf "kwok%s" $type }}
  message: simulated by kwok
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
addresses:
- type: InternalIP
  address: {{ $ip | Quote }}
- type: Hostname
  address: {{ .metadata.name | Quote }}
capacity: {{ YAML .status.capacity 1 }}
allocatable: {{ YAML .status.capacity 1 }}
daemonEndpoints:
  kubeletEndpoint:
    Port: 0
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: kwok
  kubeProxyVersion: kwok
  containerRuntimeVersion: kwok
phase: Running
"""

# A bound pod starts: regular containers running, native sidecars (init containers with restartPolicy Always)
# running, other init containers completed — what a kubelet reports once everything started. Only podIP, not
# podIPs: kwok may play this stage twice for one pod (a second event queued before its first patch is seen), and
# PodIPWith hands out a new address each call; the strategic merge of a second podIPs entry is refused (one IP per
# family) and kwok retries it in a loop — 4 076 refusals and 3× kwok's CPU in one 8 000-pod run. A podIP alone is
# replaced, and the API server derives podIPs from it (#29).
_POD_RUNNING = """\
{{ $now := Now }}
conditions:
{{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
- type: {{ . }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  restartCount: 0
{{ if eq (or .restartPolicy "") "Always" }}
  ready: true
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  ready: true
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
hostIPs:
- ip: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


MANUAL_KUBELET = "devcluster.pipefill.dev/manual-kubelet"
"""A pod annotated with this (any value) is not started by kwok: a test plays its kubelet from the start, e.g. one
whose image cannot be pulled (the pod stays Pending) and later can."""


def _stage(name: str, kind: str, expressions: list[dict[str, Any]], nxt: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},  # kwok names the core group "v1"
            "selector": {"matchExpressions": expressions},
            "next": nxt,
        },
    }


def _not_deleted() -> dict[str, Any]:
    return {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}


# A simulated node's lease lasts 120 s and is renewed every 30 s (a kubelet's: 40 s, every 10 s). At 1 000 nodes a
# kubelet's rate is 100 lease writes a second, which on this 2-core machine compete with what the operator benchmark
# measures; the controller-manager's node-monitor grace period (config.py) is longer to match (#29).
NODE_LEASE_S = 120


def kwok_config(*, server_address: str, lease_s: int = NODE_LEASE_S) -> list[dict[str, Any]]:
    """kwok's configuration documents: options, then one stage per simulated kubelet behaviour."""
    ready_status = '.status.conditions.[] | select( .type == "Ready" ) | .status'
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "cidr": POD_CIDR,
            "nodeIP": node_ip(0),
            "serverAddress": server_address,
            "manageNodesWithLabelSelector": NODE_LABEL_SELECTOR,
            "nodeLeaseDurationSeconds": lease_s,
            # Given a configuration file, kwok takes no defaults for these: it refuses to start without them.
            "nodeLeaseParallelism": 4,
            "nodePlayStageParallelism": 4,
            "podPlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 4,
        },
    }
    stages = [
        _stage(
            "node-ready",
            "Node",
            [_not_deleted(), {"key": ready_status, "operator": "NotIn", "values": ["True"]}],
            {"statusTemplate": _NODE_READY},
        ),
        _stage(
            "pod-running",
            "Pod",
            [
                _not_deleted(),
                {"key": ".spec.nodeName", "operator": "Exists"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                {"key": ready_status, "operator": "NotIn", "values": ["True"]},
                {"key": f'.metadata.annotations["{MANUAL_KUBELET}"]', "operator": "DoesNotExist"},
            ],
            {"statusTemplate": _POD_RUNNING},
        ),
        _stage(
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"finalizers": {"empty": True}, "delete": True},
        ),
    ]
    return [options, *stages]
