"""``pipefill bench operator``: many training jobs created at once on a thousand simulated GPU nodes.

A control plane with ``--nodes`` kwok nodes (8 GPUs each, none tainted; no audit log), the chart's admission policy as
``helm install`` creates it (``--no-admission-policy``: none), the operator as its own process (all namespaces, under
a ServiceAccount bound to operator/rbac/clusterrole.yaml, with ``--admission-warnings`` as the chart runs it beside
the policy), then ``--jobs`` PipelineTrainingJobs of ``--ranks`` ranks created at once from a thread pool. It
reports the seconds until every job is Running (per job: p50, p95, last), how long the control plane took to
schedule the pods apart from the operator's own work (reconcile wall time, and that time minus the waits on the API
server), reconciles per second, the operator's CPU seconds and peak resident memory, each control-plane component's
CPU seconds meanwhile (they share the machine's cores), the API requests per job (in all and by HTTP method: POST
creates, PATCH writes status, GET reads; only POST is fixed per job, the status writes vary with how long a gang
takes to start) and the ERROR lines and tracebacks in the operator's log; for a job that never became Running, why
its pods wait. kwok plays the kubelet: pods are bound and reported Running, never run.

The control plane's directory (etcd's data, every component's log, the operator's log: 60–130 MB) is removed after
the run unless ``--keep`` is given; a directory named with ``--dir`` is the caller's and stays.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from prometheus_client.parser import text_string_to_metric_families

from pipefill.devcluster import ControlPlane, bins, start
from pipefill.devcluster.cluster import repo_root
from pipefill.ports import free_port

__all__ = ["main"]

GROUP, VERSION, PLURAL = "pipefill.io", "v1alpha1", "pipelinetrainingjobs"
NAMESPACE = "bench"
OPERATOR_NAMESPACE = "pipefill-system"


def _job(index: int, ranks: int, sharing: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PipelineTrainingJob",
        "metadata": {"name": f"job-{index:03d}"},
        "spec": {
            "model": {"preset": "gpt2-small"},
            "pipeline": {"stages": ranks, "microbatches": ranks, "globalBatch": 4 * ranks},
            "resources": {"gpus": 1, "cpu": "1", "memory": "4Gi"},
            "gpuSharing": {"mode": sharing},
            "fill": {"cpu": "100m", "memory": "512Mi"},
        },
    }


def _operator_identity(cp: ControlPlane) -> Path:
    role = yaml.safe_load((repo_root() / "operator" / "rbac" / "clusterrole.yaml").read_text())
    cp.apply(
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "pipefill-operator", "namespace": OPERATOR_NAMESPACE},
            },
            role,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "pipefill-operator"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role["metadata"]["name"],
                },
                "subjects": [{"kind": "ServiceAccount", "name": "pipefill-operator", "namespace": OPERATOR_NAMESPACE}],
            },
        ]
    )
    return cp.kubeconfig_for(OPERATOR_NAMESPACE, "pipefill-operator")


def _admission_policy(cp: ControlPlane, workdir: Path) -> None:
    """The chart's ValidatingAdmissionPolicy and its binding, rendered by helm and created as ``helm install`` would."""
    home = workdir / "helm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
    env |= {var: str(home / var.lower()) for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")}
    chart = repo_root() / "charts" / "pipefill"
    argv = [str(bins.binary("helm")), "template", "pf", str(chart), "--show-only", "templates/admissionpolicy.yaml"]
    rendered = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=120).stdout
    cp.kubectl("create", "-f", "-", stdin=rendered)


def _proc_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of process ``pid`` from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return cpu_s, peak


def _components_cpu_s(cp: ControlPlane) -> dict[str, float]:
    """CPU seconds each control-plane component has used so far (the kube multi-call binary's three by name)."""
    out = {}
    for proc in cp.processes:
        try:
            out[proc.name] = _proc_usage(proc.pid)[0]
        except OSError:  # it ended
            continue
    return out


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """A histogram quantile as Prometheus' histogram_quantile computes it (linear within the bucket)."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return None


def _histogram(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> dict[str, float | None]:
    by_le: dict[float, float] = {}  # summed over the other labels (e.g. every HTTP method)
    for (n, labels), value in samples.items():
        if n == f"{name}_bucket":
            le = float(dict(labels)["le"])
            by_le[le] = by_le.get(le, 0.0) + value
    buckets = sorted(by_le.items())
    count = sum(v for (n, _), v in samples.items() if n == f"{name}_count")
    total = sum(v for (n, _), v in samples.items() if n == f"{name}_sum")
    return {
        "count": count,
        "mean_ms": round(1000 * total / count, 2) if count else None,
        "p50_ms": None if (p := _quantile(buckets, 0.5)) is None else round(1000 * p, 2),
        "p95_ms": None if (p := _quantile(buckets, 0.95)) is None else round(1000 * p, 2),
    }


def _wait_running(custom: client.CustomObjectsApi, jobs: int, started: float, timeout_s: float) -> dict[str, float]:
    """Seconds from the start until each job's status.phase is Running. The jobs listed Running already (the first
    of a thousand may run before the last is created) count at the list: missing them left the watch waiting for
    events that never came."""
    running: dict[str, float] = {}
    deadline = started + timeout_s
    listed: dict[str, Any] = json.loads(
        custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _preload_content=False).data  # type: ignore[attr-defined]
    )
    for obj in listed["items"]:
        if (obj.get("status") or {}).get("phase") == "Running":
            running[obj["metadata"]["name"]] = time.monotonic() - started
    version = listed["metadata"]["resourceVersion"]
    while len(running) < jobs and time.monotonic() < deadline:
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL,
            resource_version=version, timeout_seconds=max(1, int(deadline - time.monotonic())),
        )  # fmt: skip
        for event in stream:
            obj = event["raw_object"]
            version = obj["metadata"]["resourceVersion"]
            name = obj["metadata"]["name"]
            if (obj.get("status") or {}).get("phase") == "Running" and name not in running:
                running[name] = time.monotonic() - started
                if len(running) == jobs:
                    break
    return running


def _scheduling_s(core: client.CoreV1Api) -> list[float]:
    """Per pod: seconds from creation to the scheduler binding it (PodScheduled), the control plane's share."""
    out = []
    raw = core.list_namespaced_pod(NAMESPACE, _preload_content=False)
    for pod in json.loads(raw.data)["items"]:  # type: ignore[attr-defined]
        created = _time(pod["metadata"]["creationTimestamp"])
        for cond in (pod.get("status") or {}).get("conditions") or ():
            if cond["type"] == "PodScheduled" and cond["status"] == "True" and cond.get("lastTransitionTime"):
                out.append((_time(cond["lastTransitionTime"]) - created).total_seconds())
    return out


def _log_errors(path: Path) -> list[str]:
    """The operator log's ERROR lines and tracebacks (logging's format: ``<time> <LEVEL> <logger>: <message>``)."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if (len(parts) > 2 and parts[2] in ("ERROR", "CRITICAL")) or line.startswith("Traceback"):
            found.append(line)
    return found


def _not_running(custom: client.CustomObjectsApi, core: client.CoreV1Api, running: dict[str, float]) -> list[Any]:
    """Each job that never became Running, as the run ended: its phase, ranks ready, its pods' phases and why the
    first of its pods that do not run wait."""
    raw = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _preload_content=False)
    pods = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]  # type: ignore[attr-defined]
    out = []
    for job in json.loads(raw.data)["items"]:  # type: ignore[attr-defined]
        name = job["metadata"]["name"]
        if name in running:
            continue
        status = job.get("status") or {}
        phases: dict[str, int] = {}
        waiting = []  # why each of its pods that is not Running waits: its node, and the scheduler's word
        for pod in pods:
            if pod["metadata"].get("labels", {}).get("pipefill.io/job-name") == name:
                phase = (pod.get("status") or {}).get("phase") or "Pending"
                phases[phase] = phases.get(phase, 0) + 1
                if phase != "Running":
                    scheduled = [c for c in pod["status"].get("conditions") or () if c["type"] == "PodScheduled"]
                    why = f"{scheduled[0].get('reason', '')} {scheduled[0].get('message', '')}" if scheduled else ""
                    waiting.append(f"{pod['metadata']['name']} on {pod['spec'].get('nodeName')}: {why}".strip())
        out.append(
            {
                "job": name,
                "phase": status.get("phase"),
                "ranksReady": status.get("ranksReady"),
                "pods": phases,
                "waiting": waiting[:3],
            }
        )
    return out[:10]


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement; the control plane's directory goes afterwards unless ``--keep`` (or ``--dir``) keeps it."""
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pipefill-bench-operator-"))
    try:
        return _measure(args, workdir)
    finally:
        if args.dir or args.keep:
            print(f"control plane directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    began = time.monotonic()
    # every node schedulable: the control plane's default taints its last node like a dedicated GPU node, and a
    # run of exactly as many ranks as GPUs then left one gang 8 GPUs short, Pending for good (the "lost" job)
    cp = start(workdir, nodes=args.nodes, audit=False, tainted=0)
    result: dict[str, Any] = {
        "benchmark": "operator",
        "nodes": args.nodes,
        "gpus_per_node": 8,
        "jobs": args.jobs,
        "ranks_per_job": args.ranks,
        "pods": args.jobs * args.ranks,
        "sharing": args.sharing,
        "workers": args.workers,
        "control_plane_start_s": round(time.monotonic() - began, 1),
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "admission_policy": args.admission_policy,
    }
    operator: subprocess.Popen[bytes] | None = None
    stack = contextlib.ExitStack()
    try:
        kubeconfig = _operator_identity(cp)
        if args.admission_policy:
            _admission_policy(cp, workdir)
        metrics_port = free_port()
        log = stack.enter_context((workdir / "operator.log").open("w"))
        operator = subprocess.Popen(
            [sys.executable, "-m", "pipefill_operator", "--kubeconfig", str(kubeconfig), "--workers", str(args.workers),
             "--metrics-address", f"127.0.0.1:{metrics_port}", "--status-interval", "30",
             *(["--admission-warnings"] if args.admission_policy else [])],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        api = config.new_client_from_config(str(cp.kubeconfig))  # type: ignore[no-untyped-call]
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        for _ in range(600):  # the operator's metrics endpoint answers once it is up
            try:
                _metrics(metrics_port)
                break
            except OSError:
                time.sleep(0.1)
        cpu_idle_s, _ = _proc_usage(operator.pid)
        components_before = _components_cpu_s(cp)
        before = _metrics(metrics_port)
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, _job(i, args.ranks, args.sharing)), range(args.jobs)))  # fmt: skip
        created_s = time.monotonic() - started
        running = _wait_running(custom, args.jobs, started, args.timeout)
        elapsed_s = time.monotonic() - started
        cpu_s, peak_rss = _proc_usage(operator.pid)
        components = _components_cpu_s(cp)
        after = _metrics(metrics_port)
        reconciles = sum(v for (n, _), v in after.items() if n == "pipefill_operator_reconciles_total") - sum(
            v for (n, _), v in before.items() if n == "pipefill_operator_reconciles_total"
        )
        times = sorted(running.values())
        sched = sorted(_scheduling_s(core))

        def requests(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
            return _histogram(samples, "pipefill_operator_api_request_duration_seconds")["count"] or 0.0

        def by_method(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
            # POST is creates (pods, children, Events), PATCH status writes, GET reads: which kind a change moved
            name = "pipefill_operator_api_request_duration_seconds_count"
            return {dict(labels)["method"]: v for (n, labels), v in samples.items() if n == name}

        result.update(
            {
                "created_s": round(created_s, 2),
                "all_running": len(running) == args.jobs,
                "not_running": _not_running(custom, core, running) if len(running) < args.jobs else [],
                "jobs_running": len(running),
                "all_running_s": round(times[-1], 2) if len(running) == args.jobs else None,
                "job_running_p50_s": round(statistics.median(times), 2) if times else None,
                "job_running_p95_s": round(times[int(0.95 * (len(times) - 1))], 2) if times else None,
                "pod_scheduling_p50_s": round(statistics.median(sched), 2) if sched else None,
                "pod_scheduling_max_s": round(sched[-1], 2) if sched else None,
                "reconciles": int(reconciles),
                "reconciles_per_s": round(reconciles / elapsed_s, 1),
                "reconcile_wall": _histogram(after, "pipefill_operator_reconcile_duration_seconds"),
                "reconcile_own": _histogram(after, "pipefill_operator_reconcile_own_seconds"),
                "api_requests": _histogram(after, "pipefill_operator_api_request_duration_seconds"),
                "api_requests_per_job": round((requests(after) - requests(before)) / args.jobs, 1),
                "api_requests_per_job_by_method": {
                    method: round((count - by_method(before).get(method, 0.0)) / args.jobs, 2)
                    for method, count in sorted(by_method(after).items())
                },
                "operator_cpu_s": round(cpu_s - cpu_idle_s, 2),
                "operator_peak_rss_mib": round(peak_rss / 2**20, 1),
                # where the machine's CPU went meanwhile: every component shares its cores with the operator
                "control_plane_cpu_s": {
                    name: round(used - components_before.get(name, 0.0), 1) for name, used in components.items()
                },
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            }
        )
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        stack.close()
        cp.stop()
    errors = _log_errors(workdir / "operator.log") if (workdir / "operator.log").exists() else []
    result["operator_log_errors"] = len(errors)
    result["operator_log_first_errors"] = errors[:5]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pipefill bench operator", description=__doc__)
    p.add_argument("--nodes", type=int, default=1000, help="kwok GPU nodes, 8 GPUs each (default %(default)s)")
    p.add_argument("--jobs", type=int, default=100, help="PipelineTrainingJobs created at once (default %(default)s)")
    p.add_argument("--ranks", type=int, default=8, help="ranks (pipeline stages) per job (default %(default)s)")
    p.add_argument("--sharing", choices=["visibleDevices", "dra", "none"], default="visibleDevices",
                   help="spec.gpuSharing.mode of the jobs (default %(default)s)")  # fmt: skip
    p.add_argument("--workers", type=int, default=8, help="the operator's reconcile workers (default %(default)s)")
    p.add_argument("--no-admission-policy", dest="admission_policy", action="store_false",
                   help="without the chart's warning policy: the operator posts its CheckpointsNotShared Events")  # fmt: skip
    p.add_argument("--timeout", type=float, default=300, help="give up after this many seconds (default %(default)s)")
    p.add_argument("--dir", help="control plane directory, kept afterwards (default: a temporary one, removed)")
    p.add_argument("--keep", action="store_true", help="keep the temporary control plane directory (logs, etcd data)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the default output, kept for symmetry)")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.jobs < 1 or args.ranks < 1 or args.ranks > 12:
        print("--nodes, --jobs >= 1 and --ranks 1..12 (the jobs train gpt2-small: 12 layers)", file=sys.stderr)
        return 2
    result = run(args)
    print(json.dumps(result, indent=None if args.json else 1))
    return 0 if result.get("all_running") and not result.get("operator_log_errors") else 1
